//! Independent pieces of work spread over the machine's cores, their results in order.

use std::sync::atomic::{AtomicUsize, Ordering};

/// `f` over every item, on as many scoped threads as the machine has cores (at most one
/// an item), each taking the next item not yet taken from the end, so that unequal items
/// balance (put the longest last: it is started first); the results in the items' order,
/// the same as `items.iter().map(f)`. A panic in `f` is raised again here.
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let taken = next.fetch_add(1, Ordering::Relaxed);
                        let Some(i) = items.len().checked_sub(taken + 1) else {
                            break;
                        };
                        mine.push((i, f(&items[i])));
                    }
                    mine
                })
            })
            .collect();
        (workers.into_iter())
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_by_key(|d| d.0);
    done.into_iter().map(|d| d.1).collect()
}

#[cfg(test)]
mod tests {
    use super::par_map;

    #[test]
    fn results_come_in_the_items_order_whatever_the_work_each_takes() {
        let items: Vec<u64> = (0..37).collect();
        // Unequal work: the later items are quick, so workers finish out of order.
        let got = par_map(&items, |&i| {
            let mut x = i;
            for _ in 0..(40 - i) * 20_000 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            }
            (i, x)
        });
        let want: Vec<(u64, u64)> = items
            .iter()
            .map(|&i| {
                let mut x = i;
                for _ in 0..(40 - i) * 20_000 {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                }
                (i, x)
            })
            .collect();
        assert_eq!(got, want);
        assert!(par_map(&[] as &[u8], |&b| b).is_empty());
    }

    #[test]
    #[should_panic(expected = "item 5")]
    fn a_panic_in_the_work_reaches_the_caller() {
        let items: Vec<u32> = (0..8).collect();
        par_map(&items, |&i| assert!(i != 5, "item {i}"));
    }
}

//! The digital twin of the bench. Empty until issue 4 lands: nothing here works yet.

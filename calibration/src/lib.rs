//! railtrace's mathematics. Empty until issues 6-8 land: nothing here works yet.

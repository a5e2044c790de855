//! The railtrace host library. Empty until issue 5 lands: nothing here works yet.

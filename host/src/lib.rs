//! The railtrace host library. Capture, recording and the rest come with issue 5; for now
//! it holds what the command line shares.

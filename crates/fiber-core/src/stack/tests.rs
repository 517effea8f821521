//! Unit tests of stack carving.

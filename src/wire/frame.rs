//! Framing: a 2-byte big-endian length, then that many bytes of a serialized
//! `UnixSocketProto`. Pure functions over byte buffers.

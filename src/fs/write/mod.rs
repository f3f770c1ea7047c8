//! The writing side of the core: a file staged here until published ([`staged`], its bytes in
//! [`body`]), what its publish sends ([`publish`]), write-back's queue ([`writeback`]) and
//! journal ([`journal`]), and the owner of them all ([`writer`]).

pub mod body;
pub mod journal;
pub mod publish;
pub mod staged;
pub mod writeback;
pub mod writer;

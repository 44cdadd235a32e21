//! The tree: a batch's structure (containers, scalars, strings, leaf
//! numbers) in a compact prefix form the main process rebuilds without
//! pickle. Any object the tree has no tag for travels as a pickle inside it
//! (`PICKLED`), its own tensors and arrays still taken out as leaves.
//!
//! Each node is a one-byte tag, then its body (integers little-endian):
//!
//! | tag | name    | body                                       |
//! |-----|---------|--------------------------------------------|
//! | 0   | NONE    |                                            |
//! | 1   | TRUE    |                                            |
//! | 2   | FALSE   |                                            |
//! | 3   | INT     | `i64`                                      |
//! | 4   | FLOAT   | `f64`                                      |
//! | 5   | STR     | `u32` n, n bytes of UTF-8                  |
//! | 6   | BYTES   | `u32` n, n bytes                           |
//! | 7   | LIST    | `u32` n, then n nodes                      |
//! | 8   | TUPLE   | `u32` n, then n nodes                      |
//! | 9   | DICT    | `u32` n, then n (key node, value node)     |
//! | 10  | LEAF    | `u32` leaf number in the record's table    |
//! | 11  | PICKLED | `u32` n, n bytes of pickle (protocol 5) whose persistent ids are leaf numbers |

use super::reader::{DecodeError, Reader};

/// The tag byte of each node kind.
pub mod tag {
    pub const NONE: u8 = 0;
    pub const TRUE: u8 = 1;
    pub const FALSE: u8 = 2;
    pub const INT: u8 = 3;
    pub const FLOAT: u8 = 4;
    pub const STR: u8 = 5;
    pub const BYTES: u8 = 6;
    pub const LIST: u8 = 7;
    pub const TUPLE: u8 = 8;
    pub const DICT: u8 = 9;
    pub const LEAF: u8 = 10;
    pub const PICKLED: u8 = 11;
}

/// Deeper structures are pickled whole by the writer (pickle copes with
/// cycles); the reader refuses anything deeper than this plus one.
pub const MAX_DEPTH: usize = 64;

/// One node as read: containers give their length, their children follow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Token<'a> {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    List(usize),
    Tuple(usize),
    Dict(usize),
    Leaf(usize),
    Pickled(&'a [u8]),
}

/// Builds a tree, node by node, in prefix order.
#[derive(Debug, Default)]
pub struct TreeWriter {
    out: Vec<u8>,
}

impl TreeWriter {
    pub fn new() -> Self {
        TreeWriter::default()
    }

    fn len(&mut self, n: usize) {
        self.out.extend_from_slice(&(n as u32).to_le_bytes());
    }

    fn tagged_bytes(&mut self, tag: u8, b: &[u8]) {
        self.out.push(tag);
        self.len(b.len());
        self.out.extend_from_slice(b);
    }

    /// Appends one node; a container's children are written after it.
    pub fn put(&mut self, token: Token<'_>) {
        match token {
            Token::None => self.out.push(tag::NONE),
            Token::Bool(true) => self.out.push(tag::TRUE),
            Token::Bool(false) => self.out.push(tag::FALSE),
            Token::Int(v) => {
                self.out.push(tag::INT);
                self.out.extend_from_slice(&v.to_le_bytes());
            }
            Token::Float(v) => {
                self.out.push(tag::FLOAT);
                self.out.extend_from_slice(&v.to_le_bytes());
            }
            Token::Str(s) => self.tagged_bytes(tag::STR, s.as_bytes()),
            Token::Bytes(b) => self.tagged_bytes(tag::BYTES, b),
            Token::List(n) => {
                self.out.push(tag::LIST);
                self.len(n);
            }
            Token::Tuple(n) => {
                self.out.push(tag::TUPLE);
                self.len(n);
            }
            Token::Dict(n) => {
                self.out.push(tag::DICT);
                self.len(n);
            }
            Token::Leaf(id) => {
                self.out.push(tag::LEAF);
                self.len(id);
            }
            Token::Pickled(b) => self.tagged_bytes(tag::PICKLED, b),
        }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.out
    }
}

/// Reads a tree back, one node at a time, checking every length against
/// the bytes that are there.
pub struct TreeReader<'a> {
    r: Reader<'a>,
}

impl<'a> TreeReader<'a> {
    pub fn new(tree: &'a [u8]) -> Self {
        TreeReader {
            r: Reader::new(tree),
        }
    }

    fn len(&mut self) -> Result<usize, DecodeError> {
        Ok(self.r.u32()? as usize)
    }

    fn sized(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.len()?;
        self.r.take(n)
    }

    /// A container length no larger than the nodes that could follow (each
    /// takes at least one byte), so a lying length cannot reserve memory.
    fn count(&mut self, per_item: usize) -> Result<usize, DecodeError> {
        let n = self.len()?;
        if n.saturating_mul(per_item) > self.r.remaining() {
            return Err(DecodeError("container length"));
        }
        Ok(n)
    }

    /// The next node.
    pub fn next_token(&mut self) -> Result<Token<'a>, DecodeError> {
        Ok(match self.r.u8()? {
            tag::NONE => Token::None,
            tag::TRUE => Token::Bool(true),
            tag::FALSE => Token::Bool(false),
            tag::INT => Token::Int(self.r.i64()?),
            tag::FLOAT => Token::Float(self.r.f64()?),
            tag::STR => {
                Token::Str(std::str::from_utf8(self.sized()?).map_err(|_| DecodeError("utf-8"))?)
            }
            tag::BYTES => Token::Bytes(self.sized()?),
            tag::LIST => Token::List(self.count(1)?),
            tag::TUPLE => Token::Tuple(self.count(1)?),
            tag::DICT => Token::Dict(self.count(2)?),
            tag::LEAF => Token::Leaf(self.len()?),
            tag::PICKLED => Token::Pickled(self.sized()?),
            _ => return Err(DecodeError("tree tag")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An owned tree, for generating and comparing.
    #[derive(Debug, Clone, PartialEq)]
    enum Node {
        None,
        Bool(bool),
        Int(i64),
        Float(u64),
        Str(String),
        Bytes(Vec<u8>),
        List(Vec<Node>),
        Tuple(Vec<Node>),
        Dict(Vec<(Node, Node)>),
        Leaf(u32),
        Pickled(Vec<u8>),
    }

    fn node() -> impl Strategy<Value = Node> {
        let leaf = prop_oneof![
            Just(Node::None),
            any::<bool>().prop_map(Node::Bool),
            any::<i64>().prop_map(Node::Int),
            any::<u64>().prop_map(Node::Float),
            ".{0,8}".prop_map(Node::Str),
            proptest::collection::vec(any::<u8>(), 0..8).prop_map(Node::Bytes),
            any::<u32>().prop_map(Node::Leaf),
            proptest::collection::vec(any::<u8>(), 0..8).prop_map(Node::Pickled),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Node::List),
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Node::Tuple),
                proptest::collection::vec((inner.clone(), inner), 0..3).prop_map(Node::Dict),
            ]
        })
    }

    fn write(w: &mut TreeWriter, n: &Node) {
        match n {
            Node::None => w.put(Token::None),
            Node::Bool(b) => w.put(Token::Bool(*b)),
            Node::Int(v) => w.put(Token::Int(*v)),
            Node::Float(bits) => w.put(Token::Float(f64::from_bits(*bits))),
            Node::Str(s) => w.put(Token::Str(s)),
            Node::Bytes(b) => w.put(Token::Bytes(b)),
            Node::Leaf(id) => w.put(Token::Leaf(*id as usize)),
            Node::Pickled(b) => w.put(Token::Pickled(b)),
            Node::List(v) => {
                w.put(Token::List(v.len()));
                v.iter().for_each(|c| write(w, c));
            }
            Node::Tuple(v) => {
                w.put(Token::Tuple(v.len()));
                v.iter().for_each(|c| write(w, c));
            }
            Node::Dict(v) => {
                w.put(Token::Dict(v.len()));
                for (k, x) in v {
                    write(w, k);
                    write(w, x);
                }
            }
        }
    }

    fn read(r: &mut TreeReader<'_>) -> Result<Node, DecodeError> {
        Ok(match r.next_token()? {
            Token::None => Node::None,
            Token::Bool(b) => Node::Bool(b),
            Token::Int(v) => Node::Int(v),
            Token::Float(f) => Node::Float(f.to_bits()),
            Token::Str(s) => Node::Str(s.to_owned()),
            Token::Bytes(b) => Node::Bytes(b.to_vec()),
            Token::Leaf(id) => Node::Leaf(id as u32),
            Token::Pickled(b) => Node::Pickled(b.to_vec()),
            Token::List(n) => Node::List((0..n).map(|_| read(r)).collect::<Result<_, _>>()?),
            Token::Tuple(n) => Node::Tuple((0..n).map(|_| read(r)).collect::<Result<_, _>>()?),
            Token::Dict(n) => Node::Dict(
                (0..n)
                    .map(|_| Ok((read(r)?, read(r)?)))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }

    proptest! {
        #[test]
        fn trees_round_trip(n in node()) {
            let mut w = TreeWriter::new();
            write(&mut w, &n);
            let bytes = w.into_bytes();
            let mut r = TreeReader::new(&bytes);
            prop_assert_eq!(read(&mut r).unwrap(), n);
            prop_assert_eq!(r.r.remaining(), 0);
        }

        #[test]
        fn reading_garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = TreeReader::new(&b);
            for _ in 0..64 {
                if r.next_token().is_err() { break; }
            }
        }
    }

    #[test]
    fn a_container_longer_than_its_bytes_is_refused() {
        let mut w = TreeWriter::new();
        w.put(Token::List(1 << 30));
        let bytes = w.into_bytes();
        assert_eq!(
            TreeReader::new(&bytes).next_token(),
            Err(DecodeError("container length"))
        );
    }
}

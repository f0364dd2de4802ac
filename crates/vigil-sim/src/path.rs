//! Where in a scenario file a value is: its key path (a leaf: the scenario's parser
//! and the expectations' both name places with it).

/// One step of a key path: a table key or an array index.
#[derive(Clone, Debug, PartialEq)]
pub enum PathSeg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

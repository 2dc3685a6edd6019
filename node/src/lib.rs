//! Starling node.

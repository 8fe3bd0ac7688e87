//! Prefix trie over path segments: `/a/b` matches keys `/a/b` and `/a/b/…`
//! (not `/a/bc`). Matching walks the key's segments once and collects the
//! values of every registered prefix along the way, so overlapping prefixes
//! all match.

use std::collections::HashMap;

#[derive(Debug)]
pub struct PrefixTrie<T> {
    root: Node<T>,
    len: usize,
}

#[derive(Debug)]
struct Node<T> {
    children: HashMap<Box<str>, Node<T>>,
    values: Vec<T>,
}

impl<T> Default for Node<T> {
    fn default() -> Self {
        Node {
            children: HashMap::new(),
            values: Vec::new(),
        }
    }
}

impl<T> Default for PrefixTrie<T> {
    fn default() -> Self {
        PrefixTrie {
            root: Node::default(),
            len: 0,
        }
    }
}

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

impl<T> PrefixTrie<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `value` under `prefix` (several values may share a prefix).
    pub fn insert(&mut self, prefix: &str, value: T) {
        let mut node = &mut self.root;
        for seg in segments(prefix) {
            node = node.children.entry(seg.into()).or_default();
        }
        node.values.push(value);
        self.len += 1;
    }

    /// Every value whose prefix covers `key`, shortest prefix first.
    pub fn matches<'a>(&'a self, key: &str, out: &mut Vec<&'a T>) {
        let mut node = &self.root;
        out.extend(node.values.iter());
        for seg in segments(key) {
            match node.children.get(seg) {
                Some(n) => {
                    node = n;
                    out.extend(node.values.iter());
                }
                None => break,
            }
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(t: &PrefixTrie<u32>, k: &str) -> Vec<u32> {
        let mut v = Vec::new();
        t.matches(k, &mut v);
        v.into_iter().copied().collect()
    }

    #[test]
    fn overlapping_prefixes_all_match_on_segment_boundaries() {
        let mut t = PrefixTrie::new();
        t.insert("/a", 1);
        t.insert("/a/b", 2);
        t.insert("/a/b", 3);
        t.insert("/a/bc", 4);
        t.insert("/x/y/z", 5);
        assert_eq!(m(&t, "/a/b/k"), vec![1, 2, 3]);
        assert_eq!(m(&t, "/a/bc/k"), vec![1, 4]);
        assert_eq!(m(&t, "/a/bcd"), vec![1]);
        assert_eq!(m(&t, "/ab"), Vec::<u32>::new());
        assert_eq!(m(&t, "/x/y"), Vec::<u32>::new());
        assert_eq!(m(&t, "/x/y/z"), vec![5]);
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn many_prefixes_match_like_a_linear_scan() {
        let mut t = PrefixTrie::new();
        let prefixes: Vec<String> = (0..2000).map(|i| format!("/p{}/q{}", i % 50, i)).collect();
        for (i, p) in prefixes.iter().enumerate() {
            t.insert(p, i as u32);
        }
        for probe in ["/p7/q7/obj", "/p7/q57/x", "/p49/q1999", "/p3", "/p3/q3"] {
            let mut want: Vec<u32> = prefixes
                .iter()
                .enumerate()
                .filter(|(_, p)| probe == p.as_str() || probe.starts_with(&format!("{p}/")))
                .map(|(i, _)| i as u32)
                .collect();
            want.sort_unstable();
            let mut got = m(&t, probe);
            got.sort_unstable();
            assert_eq!(got, want, "{probe}");
        }
    }
}

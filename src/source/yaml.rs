//! A linear pre-check of YAML text before it reaches the parser: libyaml (under serde_yaml)
//! spends time quadratic in the depth of nested flow collections (`{a: {a: …`: 200 KB cost
//! 3.7 s in a release build, 13 s in a debug one) before its own recursion limit rejects the
//! document. Counting the depth first, in one pass, rejects such a document in microseconds.
//! Pure.

/// The deepest nesting accepted: serde_yaml's own recursion limit, so nothing it would
/// parse is refused here (real Kubernetes objects nest about 10 levels).
pub const MAX_DEPTH: usize = 128;

/// `Err` with the 1-based line where flow collections nest deeper than [`MAX_DEPTH`].
///
/// Counts `{` and `[` that open a collection (at the start of a token) and their closers,
/// skipping quoted scalars and comments. A bracket inside a plain scalar (`a[0]`) is not at a
/// token start and is not counted.
pub fn check_depth(text: &str) -> Result<(), usize> {
    let b = text.as_bytes();
    let (mut depth, mut line) = (0usize, 1usize);
    let mut prev = b'\n';
    let mut i = 0;
    let token_start = |p: u8| {
        matches!(
            p,
            b' ' | b'\t' | b'\n' | b'\r' | b':' | b',' | b'[' | b'{' | b'-' | b'?'
        )
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => line += 1,
            b'"' | b'\'' if token_start(prev) => {
                // A quoted scalar, possibly over several lines; `\` escapes in double
                // quotes, `''` is a quote in single quotes.
                i += 1;
                while i < b.len() {
                    match b[i] {
                        b'\n' => line += 1,
                        b'\\' if c == b'"' => i += 1,
                        q if q == c => {
                            if c == b'\'' && b.get(i + 1) == Some(&b'\'') {
                                i += 1;
                            } else {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            b'#' if matches!(prev, b' ' | b'\t' | b'\n') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'{' | b'[' if token_start(prev) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(line);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        prev = c;
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_flow_nesting_is_refused_in_linear_time() {
        let deep = "{a: ".repeat(50_000) + &"}".repeat(50_000);
        let t0 = std::time::Instant::now();
        assert_eq!(check_depth(&deep), Err(1));
        let lines = "[\n".repeat(200) + &"]\n".repeat(200);
        assert_eq!(check_depth(&lines), Err(MAX_DEPTH + 1));
        assert!(
            t0.elapsed() < std::time::Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn ordinary_documents_and_brackets_in_scalars_pass() {
        let ok = "metadata: {name: a, labels: {x: \"{{{{[[[[\"}}\nspec:\n  ports: [{port: 80}]\n  # [[[[[[[[\n  note: 'it''s [[[['\n  path: a[0][1][2]\n";
        assert_eq!(check_depth(ok), Ok(()));
        let edge = "{a: ".repeat(MAX_DEPTH) + &"}".repeat(MAX_DEPTH);
        assert_eq!(check_depth(&edge), Ok(()));
        let many_lines = "k: a[\n".repeat(1000);
        assert_eq!(check_depth(&many_lines), Ok(()), "not at a token start");
    }
}

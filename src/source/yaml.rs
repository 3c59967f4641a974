//! The YAML parser every YAML input goes through (manifests, the config file), with the
//! limits hostile input meets, and a linear pre-check of the text before it reaches the
//! parser. The pre-check came with libyaml (under serde_yaml, replaced by serde-saphyr in
//! issue #37), which spent time quadratic in the depth of nested flow collections
//! (`{a: {a: …`: 200 KB cost 3.7 s in a release build) before its recursion limit rejected
//! the document; counting the depth in one pass still names the line in microseconds. Pure.

/// The deepest nesting accepted: serde-saphyr's default, which it keeps to protect the stack
/// (a debug build overflowed a 2 MiB thread stack below 128 levels, libyaml's limit that we
/// had before); real Kubernetes objects nest about 10 levels.
pub const MAX_DEPTH: usize = 64;

/// The parser's options: YAML 1.1 scalars as Kubernetes' own decoder (sigs.k8s.io/yaml over
/// go-yaml v2) reads them (`0755` is octal, `yes`/`on` are booleans where a boolean is
/// expected), repeated keys passed to the decoder (a typed object refuses a repeated field,
/// the config decoder names it as upstream's strict decoding does), errors on one line.
///
/// Limits: [`MAX_DEPTH`]; aliases as serde-saphyr bounds them by default (50k aliases and
/// anchors, 1M replayed events: a "billion laughs" document is refused after that much
/// work). Events, nodes and scalar bytes are not capped here: a document is at most a file,
/// and files are bounded by size before they are read (256 MiB for manifests), which bounds
/// them linearly; serde-saphyr's defaults (250k nodes) would refuse a `kind: List` of 3k
/// Services.
pub fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.max_events = usize::MAX;
    budget.max_nodes = usize::MAX;
    budget.max_total_scalar_bytes = usize::MAX;
    let mut o = serde_saphyr::Options::default();
    o.budget = Some(budget);
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::PassThrough;
    o.legacy_octal_numbers = true;
    o.emit_comments = false;
    o.with_snippet = false;
    o
}

/// One YAML document as `T`, with [`options`].
pub fn from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// A parse error in libyaml's words where serde-saphyr's differ: what go-yaml, and so upstream
/// kube-proxy and kubectl, print for the same text (upstream's TestLoadConfigFailures expects
/// "could not find expected ':'"). The position follows as serde-saphyr gives it.
pub fn error_message(e: &serde_saphyr::Error) -> String {
    const LIBYAML_WORDS: [(&str, &str); 1] =
        [("simple key expected ':'", "could not find expected ':'")];
    let s = e.to_string();
    for (ours, theirs) in LIBYAML_WORDS {
        if let Some(rest) = s.strip_prefix(ours) {
            return format!("{theirs}{rest}");
        }
    }
    s
}

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

    fn parse(text: &str) -> Result<serde_json::Value, String> {
        from_str(text).map_err(|e| error_message(&e))
    }

    #[test]
    fn errors_are_worded_as_libyaml_words_them_with_their_line() {
        let e = parse("apiVersion: x\nTwas bryllyg, and ye slythy toves").unwrap_err();
        assert!(
            e.starts_with("could not find expected ':' at line 2"),
            "{e}"
        );
        let e = parse("apiVersion: x\nbindAddress: ::").unwrap_err();
        assert!(
            e.starts_with("mapping values are not allowed in this context at line 2"),
            "{e}"
        );
    }

    #[test]
    fn nesting_is_bounded_at_max_depth() {
        let nested = |n: usize| {
            (0..n)
                .map(|i| format!("{}k:\n", "  ".repeat(i)))
                .collect::<String>()
                + &"  ".repeat(n)
                + "leaf\n"
        };
        assert!(parse(&nested(MAX_DEPTH - 1)).is_ok());
        let e = parse(&nested(MAX_DEPTH + 1)).unwrap_err();
        assert!(e.contains("depth"), "{e}");
    }

    #[test]
    fn alias_expansion_is_bounded() {
        // "A billion laughs": 10 levels of 10 aliases each would expand to 10^10 scalars.
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            doc += &format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n");
        }
        let e = parse(&doc).unwrap_err();
        assert!(e.contains("budget") || e.contains("alias"), "{e}");
        // Ordinary anchors still work.
        let v = parse("a: &p {port: 80}\nb: *p\n").unwrap();
        assert_eq!(v["b"]["port"], 80);
    }

    #[test]
    fn a_large_list_is_not_refused_by_node_counts() {
        // 5k Services in one `kind: List` document: ~300k nodes, above serde-saphyr's default
        // of 250k; files are bounded by size instead.
        let items: String = (0..5000)
            .map(|i| format!("- {{apiVersion: v1, kind: Service, metadata: {{name: s{i}, namespace: n, labels: {{a: b, c: d}}}}, spec: {{ports: [{{port: 80, protocol: TCP, name: http}}], clusterIP: 10.0.0.1}}}}\n"))
            .collect();
        let v = parse(&format!("apiVersion: v1\nkind: List\nitems:\n{items}")).unwrap();
        assert_eq!(v["items"].as_array().unwrap().len(), 5000);
    }

    #[test]
    fn scalars_read_as_kubernetes_reads_them() {
        #[derive(serde::Deserialize)]
        struct T {
            mode: u32,
            on: bool,
            name: String,
        }
        // go-yaml v2 (YAML 1.1): a leading zero is octal, `yes` is a boolean.
        let t: T = from_str("mode: 0755\non: yes\nname: yes\n").unwrap();
        assert_eq!((t.mode, t.on, t.name.as_str()), (0o755, true, "yes"));
    }

    #[test]
    fn a_repeated_field_reaches_the_decoder() {
        // k8s-openapi's objects keep the last, as the API server's non-strict decoding does.
        let svc: k8s_openapi::api::core::v1::Service =
            from_str("metadata: {name: a}\nmetadata: {name: b}\n").unwrap();
        assert_eq!(svc.metadata.name.as_deref(), Some("b"));
        // A map sees both (the config decoder names the repeated one).
        #[derive(serde::Deserialize)]
        struct Count(#[serde(deserialize_with = "entries")] usize);
        fn entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = usize;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a map")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut a: A,
                ) -> Result<usize, A::Error> {
                    let mut n = 0;
                    while a.next_entry::<String, serde::de::IgnoredAny>()?.is_some() {
                        n += 1;
                    }
                    Ok(n)
                }
            }
            d.deserialize_map(V)
        }
        let Count(n) = from_str("a: 1\nb: 2\na: 3\n").unwrap();
        assert_eq!(n, 3);
    }
}

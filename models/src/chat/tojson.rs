//! The `tojson` filter as Hugging Face's chat templates see it: Python's `json.dumps` with
//! `ensure_ascii=False` (`", "` between items and `": "` after keys; with `indent`, one item
//! per line and `","`), keys in their given order unless `sort_keys`, and no HTML
//! escaping. Models whose templates list tools with `tojson` were trained on this layout.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `value | tojson`, `tojson(indent=4)`, `tojson(4)`, `tojson(separators=(",", ":"))`,
/// `tojson(sort_keys=true)`.
pub(super) fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(layout_indent(&v)?),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid("tojson: separators must be two strings"))?;
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => Some((item, key)),
                Err(_) => return Err(invalid("tojson: separators must be two strings")),
            }
        }
        _ => None,
    };
    kwargs.assert_all_used()?;
    let (item, key) = separators.unwrap_or_else(|| {
        let item = if indent.is_some() { "," } else { ", " };
        (item.to_owned(), ": ".to_owned())
    });
    let layout = Layout {
        indent,
        item: &item,
        key: &key,
        sort_keys,
    };
    let mut out = String::new();
    layout.write(&value, 0, &mut out)?;
    Ok(out)
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_owned())
}

/// Python's `indent`: a count of spaces, or the string itself.
fn layout_indent(v: &Value) -> Result<String, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.to_owned());
    }
    match i64::try_from(v.clone()) {
        Ok(n) if (0..=16).contains(&n) => Ok(" ".repeat(n as usize)),
        _ => Err(invalid("tojson: indent must be 0 to 16 spaces or a string")),
    }
}

struct Layout<'a> {
    indent: Option<String>,
    item: &'a str,
    key: &'a str,
    sort_keys: bool,
}

impl Layout<'_> {
    /// Writes `v`, walking minijinja's own maps and sequences so that keys keep the order
    /// they have there (a dict literal's order; request JSON arrives with sorted keys).
    fn write(&self, v: &Value, level: usize, out: &mut String) -> Result<(), Error> {
        // Indentation makes the text grow with depth times items: bounded like a render's
        // output, so a request's tools cannot make a real template build gigabytes.
        if out.len() > super::TEMPLATE_OUTPUT_BYTES {
            return Err(invalid(&format!(
                "tojson: the JSON exceeds {} bytes",
                super::TEMPLATE_OUTPUT_BYTES
            )));
        }
        match v.kind() {
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for k in v.try_iter()? {
                    let name = match k.as_str() {
                        Some(s) => s.to_owned(),
                        None => k.to_string(),
                    };
                    entries.push((name, v.get_item(&k)?));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.iter().enumerate() {
                    self.between(i, level + 1, out);
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push_str(self.key);
                    self.write(x, level + 1, out)?;
                }
                if !entries.is_empty() {
                    self.close(level, out);
                }
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                out.push('[');
                let mut n = 0;
                for x in v.try_iter()? {
                    self.between(n, level + 1, out);
                    self.write(&x, level + 1, out)?;
                    n += 1;
                }
                if n > 0 {
                    self.close(level, out);
                }
                out.push(']');
            }
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            // Scalars as serde_json writes them (strings unescaped beyond JSON's own
            // rules, as with `ensure_ascii=False`).
            _ => {
                let json = serde_json::to_value(v).map_err(|e| {
                    invalid(&format!("tojson: value cannot be written as JSON: {e}"))
                })?;
                out.push_str(&json.to_string());
            }
        }
        Ok(())
    }

    /// What comes before item `i` at `level`.
    fn between(&self, i: usize, level: usize, out: &mut String) {
        if i > 0 {
            out.push_str(self.item);
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(level));
        }
    }

    /// What comes before the closing bracket at `level`.
    fn close(&self, level: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(level));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use minijinja::{context, Environment};

    #[test]
    fn the_layout_is_pythons() {
        // A dict literal keeps its order, as a Python dict does.
        let v = "{'b': [1, \"x<y>'&\"], 'a': {}, 'c': {'d': none}}";
        let src = |args: &str| format!("{{{{ {v} | tojson{args} }}}}");
        let render = |args: &str| {
            let mut env = Environment::new();
            env.add_filter("tojson", super::tojson);
            env.render_str(&src(args), context! {}).unwrap()
        };
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            render(""),
            r#"{"b": [1, "x<y>'&"], "a": {}, "c": {"d": null}}"#
        );
        // json.dumps(v, ensure_ascii=False, indent=2)
        assert_eq!(
            render("(indent=2)"),
            "{\n  \"b\": [\n    1,\n    \"x<y>'&\"\n  ],\n  \"a\": {},\n  \"c\": {\n    \"d\": null\n  }\n}"
        );
        assert_eq!(
            render("(separators=(',', ':'), sort_keys=true)"),
            r#"{"a":{},"b":[1,"x<y>'&"],"c":{"d":null}}"#
        );
        let one = |value| {
            let mut env = Environment::new();
            env.add_filter("tojson", super::tojson);
            env.render_str("{{ v | tojson }}", context! { v => value })
                .unwrap()
        };
        assert_eq!(one(serde_json::json!("é\n")), r#""é\n""#);
        assert_eq!(
            one(serde_json::json!({"x": [1.5, true, -2]})),
            r#"{"x": [1.5, true, -2]}"#
        );
    }

    #[test]
    fn json_past_the_output_bound_is_an_error() {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        // Three million items at an indent of sixteen: over 64 MiB of text.
        let big = vec![vec![1u8; 1000]; 3000];
        let err = env
            .render_str("{{ v | tojson(indent=16) }}", context! { v => big })
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        for src in [
            "{{ 1 | tojson(indent=-1) }}",
            "{{ 1 | tojson(colour=1) }}",
            "{{ 1 | tojson(separators=1) }}",
        ] {
            assert!(env.render_str(src, context! {}).is_err(), "{src}");
        }
    }
}

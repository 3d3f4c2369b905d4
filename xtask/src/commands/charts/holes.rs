//! Helm template text from a kustomize object: what the chart's values decide is replaced
//! by a hole (a plain word, `zzhole<n>zz`), the object is written as YAML by the same
//! serializer as everything else, and each hole is then filled with its template text. So
//! the YAML layout is the serializer's and only the holes are written by hand; a hole
//! left unfilled, or filled twice, is an error.
//!
//! The word starts with `zz` so that, as a mapping key, it sorts after every real key
//! (mappings are written in key order): a key hole never stands first in a list item.

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Lines that replace a hole's line, given the column of that line's key or dash (for
/// `nindent`); written without indentation, which is added.
type Lines = Box<dyn Fn(usize) -> Vec<String>>;

/// What fills a hole.
enum Fill {
    /// Template text in place of the word: a whole scalar, or a part of one (the prefix
    /// of a name).
    Inline(String),
    /// Lines in place of the line holding the hole: a mapping key `<hole>: null` or a
    /// list item `- <hole>`.
    Lines(Lines),
}

/// The holes of one object, in the order they were made.
#[derive(Default)]
pub struct Holes {
    fills: Vec<Fill>,
}

const PREFIX: &str = "zzhole";
const SUFFIX: &str = "zz";

impl Holes {
    fn word(&mut self, fill: Fill) -> String {
        self.fills.push(fill);
        format!("{PREFIX}{}{SUFFIX}", self.fills.len() - 1)
    }

    /// A word to put in a scalar (alone or with text around it), filled with `template`.
    pub fn inline(&mut self, template: impl Into<String>) -> String {
        self.word(Fill::Inline(template.into()))
    }

    /// Adds a key to `map` whose line is replaced by `lines(column)`.
    ///
    /// # Errors
    /// When `map` is not a mapping.
    pub fn key(
        &mut self,
        map: &mut Value,
        lines: impl Fn(usize) -> Vec<String> + 'static,
    ) -> Result<()> {
        let word = self.word(Fill::Lines(Box::new(lines)));
        map.as_object_mut()
            .context("a key hole needs a mapping")?
            .insert(word, Value::Null);
        Ok(())
    }

    /// A list item whose line is replaced by `lines(column of its dash)`.
    pub fn item(&mut self, lines: impl Fn(usize) -> Vec<String> + 'static) -> Value {
        Value::String(self.word(Fill::Lines(Box::new(lines))))
    }

    /// `value` as YAML with every hole filled.
    ///
    /// # Errors
    /// When a hole is missing from the YAML or stands where its fill cannot go.
    pub fn fill(&self, value: &Value) -> Result<String> {
        let yaml = serde_saphyr::to_string(value).context("writing YAML")?;
        let mut used = vec![false; self.fills.len()];
        let mut out = Vec::new();
        for line in yaml.lines() {
            let column = line.len() - line.trim_start().len();
            if let Some(index) = whole_line_hole(line.trim_start()) {
                let Some(Fill::Lines(lines)) = self.fills.get(index) else {
                    bail!(
                        "hole {index} stands alone on a line but is not filled with lines: {line:?}"
                    );
                };
                mark(&mut used, index)?;
                for filled in lines(column) {
                    out.push(if filled.is_empty() {
                        filled
                    } else {
                        format!("{}{filled}", " ".repeat(column))
                    });
                }
                continue;
            }
            let mut line = line.to_owned();
            while let Some((start, end, index)) = find_word(&line) {
                let Some(Fill::Inline(text)) = self.fills.get(index) else {
                    bail!("hole {index} stands inside a line but is filled with lines: {line:?}");
                };
                mark(&mut used, index)?;
                line.replace_range(start..end, text);
            }
            out.push(line);
        }
        if let Some(index) = used.iter().position(|u| !u) {
            bail!("hole {index} is not in the written YAML:\n{yaml}");
        }
        Ok(out.join("\n") + "\n")
    }
}

fn mark(used: &mut [bool], index: usize) -> Result<()> {
    match used.get_mut(index) {
        Some(u) if !*u => {
            *u = true;
            Ok(())
        }
        Some(_) => bail!("hole {index} appears twice"),
        None => bail!("no hole {index}"),
    }
}

/// The first hole word in `line`: its byte range and number.
fn find_word(line: &str) -> Option<(usize, usize, usize)> {
    let start = line.find(PREFIX)?;
    let digits_start = start + PREFIX.len();
    let digits = line[digits_start..]
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    let digits_end = digits_start + digits;
    if digits == 0 || !line[digits_end..].starts_with(SUFFIX) {
        return None;
    }
    let index = line[digits_start..digits_end].parse().ok()?;
    Some((start, digits_end + SUFFIX.len(), index))
}

/// The hole a whole line stands for: `<hole>: null` (a key) or `- <hole>` (an item).
fn whole_line_hole(trimmed: &str) -> Option<usize> {
    let word = trimmed
        .strip_prefix("- ")
        .or_else(|| {
            ["", " null", " ~"]
                .iter()
                .find_map(|rest| trimmed.strip_suffix(&format!(":{rest}")))
        })
        .unwrap_or(trimmed);
    let (start, end, index) = find_word(word)?;
    (start == 0 && end == word.len() && word != trimmed).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inline_key_and_item_holes_are_filled() -> Result<()> {
        let mut holes = Holes::default();
        let name = format!("{}-metrics", holes.inline("{{ include \"x.fullname\" $ }}"));
        let mut object = json!({"metadata": {"name": name}, "list": ["a"]});
        holes.key(&mut object["metadata"], |column| {
            vec![
                "{{- with $.Values.annotations }}".into(),
                "annotations:".into(),
                format!("  {{{{- toYaml . | nindent {} }}}}", column + 2),
                "{{- end }}".into(),
            ]
        })?;
        let item = holes.item(|_| vec!["- {{ $.Values.extra }}".into()]);
        if let Some(list) = object["list"].as_array_mut() {
            list.push(item);
        }
        let text = holes.fill(&object)?;
        assert!(
            text.contains("name: {{ include \"x.fullname\" $ }}-metrics"),
            "{text}"
        );
        assert!(
            text.contains("  {{- with $.Values.annotations }}\n  annotations:\n    {{- toYaml . | nindent 4 }}\n  {{- end }}"),
            "{text}"
        );
        assert!(text.contains("- a\n"), "{text}");
        assert!(text.contains("- {{ $.Values.extra }}"), "{text}");
        assert!(!text.contains(PREFIX), "{text}");
        Ok(())
    }

    #[test]
    fn a_hole_left_out_of_the_object_is_an_error() {
        let mut holes = Holes::default();
        let _unused = holes.inline("x");
        assert!(holes.fill(&json!({"a": 1})).is_err());
    }

    #[test]
    fn words_are_found_whole() {
        assert_eq!(find_word("name: zzhole12zz-x"), Some((6, 16, 12)));
        assert_eq!(find_word("zzholezz"), None);
        assert_eq!(whole_line_hole("zzhole3zz: null"), Some(3));
        assert_eq!(whole_line_hole("- zzhole4zz"), Some(4));
        assert_eq!(whole_line_hole("name: zzhole5zz"), None);
        assert_eq!(whole_line_hole("zzhole6zz"), None);
    }
}

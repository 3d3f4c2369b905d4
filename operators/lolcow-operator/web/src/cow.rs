//! The cow itself: a cowsay-style speech bubble and the classic cow below it.
//!
//! Everything here is pure string layout, so it is easy to test. Widths are
//! counted in `char`s (Unicode scalar values), never in bytes, so `héllo` is
//! five columns wide. (East Asian wide characters and emoji still count as
//! one column each; good enough for a cow.)

use std::fmt::Write as _;

/// Default maximum number of characters on one line inside the bubble.
pub const DEFAULT_WIDTH: usize = 40;

/// The classic cow, standing below and to the right of the bubble.
const COW: &str = r"        \   ^__^
         \  (oo)\_______
            (__)\       )\/\
                ||----w |
                ||     ||
";

/// Splits `text` into the lines that go inside the bubble.
///
/// - Each input line (separated by `\n`, `\r\n` or `\r`) starts a new bubble
///   line; blank lines inside the text are kept.
/// - Leading and trailing blank lines of the whole text are dropped, as are
///   trailing spaces.
/// - Runs of whitespace (including tabs) collapse to one space, and words are
///   wrapped greedily so no line is longer than `width` characters.
/// - A word longer than `width` is broken into `width`-sized pieces.
/// - Control characters (escape sequences and the like) are removed.
///
/// Empty (or all-whitespace) text gives no lines. A `width` of 0 is treated
/// as 1.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut lines = Vec::new();
    for input_line in normalized.split('\n') {
        wrap_line(input_line, width, &mut lines);
    }
    // Blank lines at either end add nothing but an empty row in the bubble.
    let first = lines.iter().position(|l| !l.is_empty());
    let last = lines.iter().rposition(|l| !l.is_empty());
    match (first, last) {
        (Some(first), Some(last)) => lines.drain(first..=last).collect(),
        _ => Vec::new(),
    }
}

/// Wraps one input line (no newlines in it) onto the end of `out`; always
/// pushes at least one (possibly empty) line.
fn wrap_line(line: &str, width: usize, out: &mut Vec<String>) {
    let start = out.len();
    let mut current = String::new();
    let mut current_len = 0;
    for word in line.split_whitespace() {
        let chars: Vec<char> = word.chars().filter(|c| !c.is_control()).collect();
        if chars.is_empty() {
            continue;
        }
        let needed = if current_len == 0 {
            chars.len()
        } else {
            current_len + 1 + chars.len()
        };
        if needed <= width {
            if current_len > 0 {
                current.push(' ');
            }
            current.extend(&chars);
            current_len = needed;
            continue;
        }
        // The word does not fit on this line: start a new one.
        if current_len > 0 {
            out.push(std::mem::take(&mut current));
        }
        let mut pieces = chars.chunks(width).peekable();
        while let Some(piece) = pieces.next() {
            if pieces.peek().is_some() {
                out.push(piece.iter().collect());
            } else {
                // The last piece stays open so following words can join it.
                current = piece.iter().collect();
                current_len = piece.len();
            }
        }
    }
    if current_len > 0 || out.len() == start {
        out.push(current);
    }
}

/// Draws the speech bubble around already-wrapped `lines`, exactly as
/// cowsay does: one line uses `< >`; more lines use `/ \` on the first,
/// `\ /` on the last and `| |` in between. No lines draw an empty bubble.
///
/// The result ends with a newline.
pub fn bubble(lines: &[String]) -> String {
    let empty = [String::new()];
    let lines = if lines.is_empty() { &empty[..] } else { lines };
    let width = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    let _ = writeln!(out, " {}", "_".repeat(width + 2));
    let count = lines.len();
    for (i, line) in lines.iter().enumerate() {
        let (left, right) = match (count, i) {
            (1, _) => ('<', '>'),
            (_, 0) => ('/', '\\'),
            (_, i) if i == count - 1 => ('\\', '/'),
            _ => ('|', '|'),
        };
        // `{:<width$}` pads by char count, which is what we want.
        let _ = writeln!(out, "{left} {line:<width$} {right}");
    }
    let _ = writeln!(out, " {}", "-".repeat(width + 2));
    out
}

/// The whole picture: `text` wrapped at `width`, in a bubble, said by the
/// cow. Plain text ending with a newline; escape it before putting it in
/// HTML (see [`escape_html`]).
pub fn cowsay(text: &str, width: usize) -> String {
    let mut out = bubble(&wrap(text, width));
    out.push_str(COW);
    out
}

/// Escapes `&`, `<`, `>`, `"` and `'` so `text` is safe both in HTML text
/// and inside quoted attribute values.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn short_text_is_one_line() {
        assert_eq!(wrap("Hello, world!", 40), lines(&["Hello, world!"]));
    }

    #[test]
    fn wraps_at_word_boundaries() {
        let text = "the quick brown fox jumps over the lazy dog";
        assert_eq!(
            wrap(text, 10),
            lines(&["the quick", "brown fox", "jumps over", "the lazy", "dog"])
        );
        for line in wrap(text, 10) {
            assert!(line.chars().count() <= 10, "{line:?} too long");
        }
    }

    #[test]
    fn line_may_be_exactly_the_width() {
        assert_eq!(wrap("aaaa bbbb", 9), lines(&["aaaa bbbb"]));
        assert_eq!(wrap("aaaa bbbbb", 9), lines(&["aaaa", "bbbbb"]));
    }

    #[test]
    fn default_width_is_forty() {
        let text = "word ".repeat(30);
        let wrapped = wrap(&text, DEFAULT_WIDTH);
        assert!(wrapped.len() > 1);
        assert!(wrapped.iter().all(|l| l.chars().count() <= DEFAULT_WIDTH));
        // 8 five-char "word " slots fit in 40 columns once the last space goes.
        assert_eq!(wrapped[0], "word ".repeat(8).trim_end());
    }

    #[test]
    fn long_words_are_broken() {
        assert_eq!(
            wrap("abcdefghijklmnopqrstuvwxyz", 10),
            lines(&["abcdefghij", "klmnopqrst", "uvwxyz"])
        );
    }

    #[test]
    fn long_word_after_short_words_starts_a_new_line_and_tail_is_shared() {
        assert_eq!(
            wrap("hi abcdefghijkl yo", 10),
            lines(&["hi", "abcdefghij", "kl yo"])
        );
    }

    #[test]
    fn long_word_of_exact_multiple_leaves_no_empty_line() {
        assert_eq!(wrap("aaaabbbb", 4), lines(&["aaaa", "bbbb"]));
    }

    #[test]
    fn multi_line_input_keeps_its_lines() {
        assert_eq!(
            wrap("one\ntwo\r\nthree\rfour", 40),
            lines(&["one", "two", "three", "four"])
        );
    }

    #[test]
    fn blank_lines_inside_are_kept_but_not_at_the_ends() {
        assert_eq!(
            wrap("\n\nfirst\n\nsecond\n\n", 40),
            lines(&["first", "", "second"])
        );
    }

    #[test]
    fn each_input_line_is_wrapped_separately() {
        assert_eq!(wrap("aa bb cc\ndd", 5), lines(&["aa bb", "cc", "dd"]));
    }

    #[test]
    fn empty_and_blank_text_give_no_lines() {
        assert!(wrap("", 40).is_empty());
        assert!(wrap("   \n\t\n  ", 40).is_empty());
    }

    #[test]
    fn trailing_and_repeated_spaces_do_not_widen_the_bubble() {
        assert_eq!(wrap("  moo   moo \t ", 40), lines(&["moo moo"]));
        assert_eq!(bubble(&wrap("moo   ", 40)), " _____\n< moo >\n -----\n");
    }

    #[test]
    fn control_characters_are_removed() {
        assert_eq!(wrap("\u{1b}[31mred\u{7}", 40), lines(&["[31mred"]));
    }

    #[test]
    fn unicode_width_counts_chars_not_bytes() {
        // 10 chars, 20 bytes.
        let text = "éééééééééé";
        assert_eq!(text.len(), 20);
        assert_eq!(wrap(text, 10), lines(&[text]));
        assert_eq!(wrap("ñañañañaña ñu", 10), lines(&["ñañañañaña", "ñu"]));
        let drawn = bubble(&lines(&["héllo", "wörld!"]));
        assert_eq!(drawn, " ________\n/ héllo  \\\n\\ wörld! /\n --------\n");
    }

    #[test]
    fn unicode_long_word_is_broken_on_char_boundaries() {
        assert_eq!(
            wrap("日本語のテキスト", 3),
            lines(&["日本語", "のテキ", "スト"])
        );
    }

    #[test]
    fn zero_width_is_treated_as_one() {
        assert_eq!(wrap("ab", 0), lines(&["a", "b"]));
    }

    #[test]
    fn single_line_bubble_uses_angle_brackets() {
        assert_eq!(
            bubble(&lines(&["Hello"])),
            " _______\n< Hello >\n -------\n"
        );
    }

    #[test]
    fn two_line_bubble_uses_slashes() {
        assert_eq!(
            bubble(&lines(&["Hello", "there, cow"])),
            " ____________\n/ Hello      \\\n\\ there, cow /\n ------------\n"
        );
    }

    #[test]
    fn many_line_bubble_uses_bars_in_the_middle() {
        let expected = concat!(
            " _______\n",
            "/ one   \\\n",
            "| two   |\n",
            "|       |\n",
            "\\ three /\n",
            " -------\n",
        );
        assert_eq!(bubble(&lines(&["one", "two", "", "three"])), expected);
    }

    #[test]
    fn empty_bubble_matches_cowsay() {
        assert_eq!(bubble(&[]), " __\n<  >\n --\n");
        assert_eq!(cowsay("", 40).lines().nth(1), Some("<  >"));
    }

    #[test]
    fn cowsay_puts_the_cow_under_the_bubble() {
        let out = cowsay("Moo", 40);
        let expected = concat!(
            " _____\n",
            "< Moo >\n",
            " -----\n",
            "        \\   ^__^\n",
            "         \\  (oo)\\_______\n",
            "            (__)\\       )\\/\\\n",
            "                ||----w |\n",
            "                ||     ||\n",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn every_bubble_row_has_the_same_width() {
        let out = cowsay(
            "A somewhat longer fortune that certainly needs wrapping, \
             with a supercalifragilisticexpialidociouslylongword inside.\nAnd a second line.",
            DEFAULT_WIDTH,
        );
        let rows: Vec<&str> = out
            .lines()
            .take_while(|l| !l.starts_with("        \\"))
            .collect();
        let width = rows[0].chars().count() + 1; // top row has no closing char
        for row in &rows[1..rows.len() - 1] {
            assert_eq!(row.chars().count(), width, "{row:?}");
        }
        assert!(rows.len() > 4);
    }

    #[test]
    fn escapes_html_special_characters() {
        assert_eq!(
            escape_html(r#"<script>alert("hi & 'bye'")</script>"#),
            "&lt;script&gt;alert(&quot;hi &amp; &#39;bye&#39;&quot;)&lt;/script&gt;"
        );
        assert_eq!(escape_html("plain moo"), "plain moo");
        assert_eq!(escape_html("ünïcödé"), "ünïcödé");
    }

    #[test]
    fn escaped_cow_has_no_raw_markup() {
        let out = escape_html(&cowsay("<b>bold</b>", 40));
        assert!(!out.contains('<') && !out.contains('>'));
        assert!(out.contains("&lt; &lt;b&gt;bold&lt;/b&gt; &gt;"));
    }
}

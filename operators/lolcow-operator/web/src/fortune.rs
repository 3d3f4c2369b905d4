//! A small, built-in list of fortunes for when nobody gave the cow anything
//! to say. Written for this crate; short, original and family-friendly.

use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

/// The fortunes, one line each.
pub const FORTUNES: &[&str] = &[
    "A kind word costs nothing and pays out in smiles.",
    "The grass is greenest where you water it.",
    "Your bug is one well-placed log line away from being found.",
    "Small steps still move the whole herd forward.",
    "Tea first, then the hard problem.",
    "Somewhere, a cat is quietly proud of you.",
    "Every expert was once confused by semicolons.",
    "Rest is part of the work, not a break from it.",
    "The best time to write the test was before the bug.",
    "Moo is a complete sentence.",
    "Clouds are just sky cotton waiting to be noticed.",
    "You will find the missing sock. Eventually.",
    "A tidy desk invites a tidy thought.",
    "Your next good idea is hiding inside a short walk.",
    "Ask the question: the answer is shy, not absent.",
    "Good logs make brave debuggers.",
    "Share your umbrella and the rain gets smaller.",
    "Today's forecast: mostly sunny, with a chance of cows.",
    "Plant a seed, forget about it, be delighted later.",
    "Even the moon has phases. Take your time.",
    "Kindness compiles on every platform.",
    "A restarted pod is a refreshed pod.",
    "Reconcile early, reconcile often.",
    "Whistle while you wait; the build is nearly done.",
    "Fresh milk, fresh ideas, fresh start.",
    "Your future holds a surprising number of pancakes.",
    "Curiosity is the best map you will ever carry.",
    "Be the reason someone's pasture feels greener.",
    "Happy cows make happy clusters.",
    "One good nap can fix three small problems.",
    "Hello from the pasture! Have a lovely day.",
    "The cow who reads the docs never steps in the puddle.",
];

/// Picks a fortune at random.
///
/// Uses the standard library's randomly seeded hasher mixed with the clock
/// and the process id; plenty for choosing a fortune, not for anything that
/// needs real randomness.
pub fn random() -> &'static str {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    let index = usize::try_from(hasher.finish() % FORTUNES.len() as u64).unwrap_or(0);
    FORTUNES.get(index).copied().unwrap_or("Moo.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn there_are_about_thirty_unique_short_single_line_fortunes() {
        assert!(FORTUNES.len() >= 30);
        let unique: HashSet<_> = FORTUNES.iter().collect();
        assert_eq!(unique.len(), FORTUNES.len(), "duplicate fortune");
        for fortune in FORTUNES {
            assert!(!fortune.trim().is_empty());
            assert!(!fortune.contains('\n'), "{fortune:?} is not one line");
            assert!(fortune.chars().count() <= 80, "{fortune:?} is too long");
            assert_eq!(fortune.trim(), *fortune, "{fortune:?} has stray spaces");
        }
    }

    #[test]
    fn random_returns_a_listed_fortune_and_varies() {
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let fortune = random();
            assert!(FORTUNES.contains(&fortune));
            seen.insert(fortune);
        }
        assert!(seen.len() > 1, "random() always returned the same fortune");
    }
}

//! Line differences between two policy texts, for `policy diff`: the
//! shortest edit script (Myers) over the lines between the common prefix
//! and suffix, printed as a unified diff. Bounded: beyond
//! [`MAX_EDIT_DISTANCE`] edits the changed middle is shown as removed and
//! added whole (still a correct diff, only not the shortest), so a diff
//! never takes more than a few MiB or a moment.

/// The longest edit script searched for, lines.
pub const MAX_EDIT_DISTANCE: usize = 500;

/// One line of the edit script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit<'a> {
    /// In both.
    Keep(&'a str),
    /// Only in the old text.
    Remove(&'a str),
    /// Only in the new text.
    Add(&'a str),
}

/// The edit script from `old` to `new`, line by line.
pub fn edits<'a>(old: &'a str, new: &'a str) -> Vec<Edit<'a>> {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (ma, mb) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let mut out: Vec<Edit<'a>> = a[..prefix].iter().map(|l| Edit::Keep(l)).collect();
    match myers(ma, mb) {
        Some(middle) => out.extend(middle),
        None => {
            out.extend(ma.iter().map(|l| Edit::Remove(l)));
            out.extend(mb.iter().map(|l| Edit::Add(l)));
        }
    }
    out.extend(a[a.len() - suffix..].iter().map(|l| Edit::Keep(l)));
    out
}

/// The shortest edit script, or `None` when it is longer than
/// [`MAX_EDIT_DISTANCE`].
fn myers<'a>(a: &[&'a str], b: &[&'a str]) -> Option<Vec<Edit<'a>>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let cap = (a.len() + b.len()).min(MAX_EDIT_DISTANCE) as isize;
    let at = |k: isize| (k + cap + 1) as usize;
    let mut v = vec![0isize; (2 * cap + 3) as usize];
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let mut found = None;
    'search: for d in 0..=cap {
        trace.push(v.clone());
        let mut k = -d;
        while k <= d {
            let mut x = if k == -d || (k != d && v[at(k - 1)] < v[at(k + 1)]) {
                v[at(k + 1)]
            } else {
                v[at(k - 1)] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[at(k)] = x;
            if x >= n && y >= m {
                found = Some(d);
                break 'search;
            }
            k += 2;
        }
    }
    let depth = found?;
    let mut out = Vec::new();
    let (mut x, mut y) = (n, m);
    for d in (0..=depth).rev() {
        let v = &trace[d as usize];
        let k = x - y;
        let prev_k = if k == -d || (k != d && v[at(k - 1)] < v[at(k + 1)]) {
            k + 1
        } else {
            k - 1
        };
        let prev_x = v[at(prev_k)];
        let prev_y = prev_x - prev_k;
        while x > prev_x && y > prev_y {
            out.push(Edit::Keep(a[(x - 1) as usize]));
            x -= 1;
            y -= 1;
        }
        if d > 0 {
            if x == prev_x {
                out.push(Edit::Add(b[(y - 1) as usize]));
                y -= 1;
            } else {
                out.push(Edit::Remove(a[(x - 1) as usize]));
                x -= 1;
            }
        }
    }
    out.reverse();
    Some(out)
}

/// A unified diff from `old` (named `old_name`) to `new`, with `context`
/// lines around each change; empty when the texts have the same lines.
pub fn unified(old_name: &str, new_name: &str, old: &str, new: &str, context: usize) -> String {
    let script = edits(old, new);
    let changed: Vec<usize> = script
        .iter()
        .enumerate()
        .filter(|(_, e)| !matches!(e, Edit::Keep(_)))
        .map(|(i, _)| i)
        .collect();
    if changed.is_empty() {
        return String::new();
    }
    // Hunks: runs of changes whose gaps are at most 2 * context lines.
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for &i in &changed {
        let start = i.saturating_sub(context);
        let end = (i + context + 1).min(script.len());
        match hunks.last_mut() {
            Some(last) if start <= last.1 => last.1 = end,
            _ => hunks.push((start, end)),
        }
    }
    // Line numbers (1-based) at the start of each script index.
    let mut old_at = Vec::with_capacity(script.len() + 1);
    let mut new_at = Vec::with_capacity(script.len() + 1);
    let (mut o, mut n) = (1usize, 1usize);
    for e in &script {
        old_at.push(o);
        new_at.push(n);
        match e {
            Edit::Keep(_) => {
                o += 1;
                n += 1;
            }
            Edit::Remove(_) => o += 1,
            Edit::Add(_) => n += 1,
        }
    }
    old_at.push(o);
    new_at.push(n);
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    for (start, end) in hunks {
        let lines = &script[start..end];
        let olen = lines.iter().filter(|e| !matches!(e, Edit::Add(_))).count();
        let nlen = lines
            .iter()
            .filter(|e| !matches!(e, Edit::Remove(_)))
            .count();
        // A range of no lines is named by the line before it, as diff(1) does.
        let ostart = if olen == 0 {
            old_at[start] - 1
        } else {
            old_at[start]
        };
        let nstart = if nlen == 0 {
            new_at[start] - 1
        } else {
            new_at[start]
        };
        out.push_str(&format!("@@ -{ostart},{olen} +{nstart},{nlen} @@\n"));
        for e in lines {
            let (mark, line) = match e {
                Edit::Keep(l) => (' ', l),
                Edit::Remove(l) => ('-', l),
                Edit::Add(l) => ('+', l),
            };
            out.push(mark);
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The old text, rebuilt from the script's kept and removed lines; the
    /// new one from its kept and added lines.
    fn sides(script: &[Edit<'_>]) -> (Vec<String>, Vec<String>) {
        let mut old = Vec::new();
        let mut new = Vec::new();
        for e in script {
            match e {
                Edit::Keep(l) => {
                    old.push(l.to_string());
                    new.push(l.to_string());
                }
                Edit::Remove(l) => old.push(l.to_string()),
                Edit::Add(l) => new.push(l.to_string()),
            }
        }
        (old, new)
    }

    #[test]
    fn a_changed_grant_shows_as_one_hunk() {
        let old = "format = 1\n[[grants]]\nfrom = [\"web\"]\nto = [\"db\"]\n";
        let new = "format = 1\n[[grants]]\nfrom = [\"web\"]\nto = [\"db\", \"cache\"]\n";
        let d = unified("v1", "new.toml", old, new, 3);
        assert_eq!(
            d,
            "--- v1\n+++ new.toml\n@@ -1,4 +1,4 @@\n format = 1\n [[grants]]\n from = [\"web\"]\n-to = [\"db\"]\n+to = [\"db\", \"cache\"]\n"
        );
        assert_eq!(unified("a", "b", old, old, 3), "");
    }

    #[test]
    fn an_insertion_into_an_empty_text_names_line_zero() {
        let d = unified("a", "b", "", "x\n", 3);
        assert_eq!(d, "--- a\n+++ b\n@@ -0,0 +1,1 @@\n+x\n");
    }

    #[test]
    fn a_change_past_the_search_bound_is_still_a_correct_diff() {
        let old: String = (0..2000).map(|i| format!("a{i}\n")).collect();
        let new: String = (0..2000).map(|i| format!("b{i}\n")).collect();
        let script = edits(&old, &new);
        let (o, n) = sides(&script);
        assert_eq!(o.len(), 2000);
        assert_eq!(n.len(), 2000);
        assert_eq!(o[0], "a0");
        assert_eq!(n[1999], "b1999");
    }

    proptest! {
        /// Every script rebuilds both texts, and a shortest one keeps at
        /// least the lines a common prefix and suffix would.
        #[test]
        fn scripts_rebuild_both_texts(
            a in proptest::collection::vec("[abc]", 0..30),
            b in proptest::collection::vec("[abc]", 0..30),
        ) {
            let (old, new) = (a.join("\n"), b.join("\n"));
            let script = edits(&old, &new);
            let (o, n) = sides(&script);
            prop_assert_eq!(o, old.lines().map(str::to_string).collect::<Vec<_>>());
            prop_assert_eq!(n, new.lines().map(str::to_string).collect::<Vec<_>>());
            let kept = script.iter().filter(|e| matches!(e, Edit::Keep(_))).count();
            let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            prop_assert!(kept >= prefix.min(old.lines().count()));
        }
    }
}

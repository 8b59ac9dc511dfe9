//! Planning: the order in which kernels and copies run, where each value lives, and when it can
//! be dropped. Made once per session; every run follows it.

use std::collections::HashMap;

use super::partition::Group;
use crate::model::ir::{Graph, ValueId};

/// A memory space: host memory, or the memory of the device EP with this provider index.
pub type Space = Option<usize>;

/// Where a kernel input (or a graph output) is read from during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The value where its producer left it (graph inputs: host memory).
    Home(ValueId),
    /// The result of copy step `i`.
    Copy(usize),
}

/// One copy of a value into another memory space.
#[derive(Clone, Debug)]
pub struct CopyStep {
    pub value: ValueId,
    /// What is copied: the value at home, or an earlier copy (device → host → other device).
    pub src: Source,
    pub from: Space,
    pub to: Space,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Copy(usize),
    Kernel(usize),
}

/// The session's plan.
#[derive(Clone, Debug)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub copies: Vec<CopyStep>,
    /// For each kernel (group), where each of its inputs is read from.
    pub kernel_inputs: Vec<Vec<Source>>,
    /// For each graph output: where it is read from at the end.
    pub outputs: Vec<Source>,
    /// For each graph output: whether a later output reads the same source (so this one
    /// takes a copy).
    pub output_reused: Vec<bool>,
    /// Sources no later action needs, dropped after each action.
    pub release_after: Vec<Vec<Source>>,
}

/// Plans `groups` (already in a runnable order) whose providers live in `space_of[provider]`.
/// Graph outputs are brought back to host memory unless listed in `keep_on_device`.
pub fn plan(g: &Graph, groups: &[Group], space_of: &[Space], keep_on_device: &[ValueId]) -> Plan {
    let mut home: Vec<Space> = vec![None; g.values.len()];
    for grp in groups {
        for &v in &grp.outputs {
            home[v] = space_of[grp.provider];
        }
    }
    let mut planner = Planner {
        home: &home,
        copies: Vec::new(),
        copy_of: HashMap::new(),
        pending: Vec::new(),
    };
    let mut actions = Vec::new();
    let mut kernel_inputs = Vec::with_capacity(groups.len());
    for (k, grp) in groups.iter().enumerate() {
        let space = space_of[grp.provider];
        let sources: Vec<Source> = grp
            .inputs
            .iter()
            .map(|&v| planner.source_in(v, space))
            .collect();
        actions.extend(planner.pending.drain(..).map(Action::Copy));
        actions.push(Action::Kernel(k));
        kernel_inputs.push(sources);
    }
    let keep_on_device: std::collections::HashSet<ValueId> =
        keep_on_device.iter().copied().collect();
    let outputs: Vec<Source> = g
        .outputs
        .iter()
        .map(|&o| {
            if keep_on_device.contains(&o) {
                Source::Home(o)
            } else {
                planner.source_in(o, None)
            }
        })
        .collect();
    actions.extend(planner.pending.drain(..).map(Action::Copy));
    let copies = planner.copies;

    // Last action reading each source; outputs are never released.
    let mut last: HashMap<Source, usize> = HashMap::new();
    for (i, a) in actions.iter().enumerate() {
        match *a {
            Action::Kernel(k) => {
                for s in &kernel_inputs[k] {
                    last.insert(*s, i);
                }
            }
            Action::Copy(c) => {
                last.insert(copies[c].src, i);
            }
        }
    }
    for o in &outputs {
        last.remove(o);
    }
    // A value produced but never read (an unused optional output) is dropped right away.
    for (i, a) in actions.iter().enumerate() {
        if let Action::Kernel(k) = *a {
            for &v in &groups[k].outputs {
                last.entry(Source::Home(v)).or_insert(i);
            }
        }
    }
    for o in &outputs {
        last.remove(o);
    }
    let mut release_after = vec![Vec::new(); actions.len()];
    for (s, i) in last {
        release_after[i].push(s);
    }
    // From the back: an output is reused when a later one reads its source.
    let mut seen = std::collections::HashSet::new();
    let mut output_reused: Vec<bool> = outputs.iter().rev().map(|o| !seen.insert(*o)).collect();
    output_reused.reverse();
    Plan {
        actions,
        copies,
        kernel_inputs,
        outputs,
        output_reused,
        release_after,
    }
}

struct Planner<'a> {
    home: &'a [Space],
    copies: Vec<CopyStep>,
    copy_of: HashMap<(ValueId, Space), usize>,
    /// Copies made for the action about to be appended.
    pending: Vec<usize>,
}

impl Planner<'_> {
    /// Where value `v` can be read in `space`, adding copies as needed (once per space: later
    /// consumers in the same space reuse the copy).
    fn source_in(&mut self, v: ValueId, space: Space) -> Source {
        let home = self.home[v];
        if home == space {
            return Source::Home(v);
        }
        if let Some(&c) = self.copy_of.get(&(v, space)) {
            return Source::Copy(c);
        }
        // Device-to-device moves go through host memory.
        let src = if home.is_some() && space.is_some() {
            self.source_in(v, None)
        } else {
            Source::Home(v)
        };
        let from = if matches!(src, Source::Home(_)) {
            home
        } else {
            None
        };
        let c = self.copies.len();
        self.copies.push(CopyStep {
            value: v,
            src,
            from,
            to: space,
        });
        self.copy_of.insert((v, space), c);
        self.pending.push(c);
        Source::Copy(c)
    }
}

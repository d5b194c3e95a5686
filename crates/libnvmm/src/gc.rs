//! Garbage collection of page versions (SPEC §7 "garbage collection": a
//! reclaimed block's page chain is consolidated into a new page; blocks are
//! freed from the longest chains first; old versions are discarded oldest
//! first).
//!
//! A chain splits into runs of adjacent versions that no live token tells
//! apart (no live token `t` with `older.time <= t < newer.time`). Every
//! reachable state sees a run whole, so a run merges into one version: each
//! segment from its newest holder, nothing below a FRESH (deleted) version.
//! When the newest version already holds every merged segment the merge is
//! free; otherwise the segments are copied into a new block (the report's
//! consolidation). When merging cannot bring the version area under its
//! target, the oldest live token is discarded and collection goes on.
//! GC's copies are real IO on the backing file but are not charged to the
//! flash timing. The order of victims (longest chains first, then by page)
//! is the simulator's, `moneta_model::nvmm::page_table::longest_first`.

use crate::entry::{status, Entry, FLASH_PAGES_PER_BLOCK, SEGMENTS_PER_PAGE};
use crate::error::Result;
use crate::log::{AlignedBuf, Log, FLASH_PAGE_BYTES};
use crate::table::{longest_first, Table};
use crate::tokens::Tokens;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcOutcome {
    pub chains_merged: u64,
    pub versions_freed: u64,
    pub segments_copied: u64,
    pub tokens_discarded: u64,
}

/// Free a version's block, deferring reuse if the committed state has it.
fn release_block(log: &mut Log, tokens: &Tokens, e: &Entry) {
    if e.has(status::MAPPED) {
        log.free_block(
            e.flash_page / FLASH_PAGES_PER_BLOCK,
            e.time as u64 <= tokens.last,
        );
    }
}

/// Merge the runs of `vpn`'s chain.
pub fn merge_chain(
    table: &mut Table,
    log: &mut Log,
    tokens: &Tokens,
    vpn: u64,
    buf: &mut AlignedBuf,
    out: &mut GcOutcome,
) -> Result<()> {
    let chain = table.chain(vpn);
    let mut start = 0;
    while start < chain.len() {
        let mut end = start + 1;
        while end < chain.len() {
            let newer = table.get(chain[end - 1]);
            let older = table.get(chain[end]);
            if tokens.live_between(older.time as u64, newer.time as u64) {
                break;
            }
            end += 1;
        }
        if end - start > 1 {
            merge_run(table, log, tokens, &chain[start..end], buf, out)?;
        }
        start = end;
    }
    Ok(())
}

fn merge_run(
    table: &mut Table,
    log: &mut Log,
    tokens: &Tokens,
    run: &[u32],
    buf: &mut AlignedBuf,
    out: &mut GcOutcome,
) -> Result<()> {
    let versions: Vec<Entry> = run.iter().map(|&i| table.get(i)).collect();
    let newest = versions[0];
    // Each segment's source: the newest version in the run holding it,
    // looking no further than the first FRESH one.
    let mut source: [Option<usize>; SEGMENTS_PER_PAGE] = [None; SEGMENTS_PER_PAGE];
    let mut fresh = false;
    for (k, v) in versions.iter().enumerate() {
        if v.has(status::MAPPED) {
            for (s, src) in source.iter_mut().enumerate() {
                if src.is_none() && v.segment_valid(s) {
                    *src = Some(k);
                }
            }
        }
        if v.has(status::FRESH) {
            fresh = true;
            break;
        }
    }
    let valid: u32 = source
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_some())
        .map(|(s, _)| 1u32 << s)
        .sum();
    let only_newest = source.iter().all(|s| s.is_none_or(|k| k == 0));
    let mut merged = Entry {
        prev: versions.last().map_or(0, |v| v.prev),
        valid: newest.valid,
        status: (newest.status & !status::FRESH) | if fresh { status::FRESH } else { 0 },
        ..newest
    };
    if valid == 0 {
        merged.status &= !status::MAPPED;
        merged.flash_page = 0;
        release_block(log, tokens, &newest);
    } else if !only_newest {
        let block = log.alloc_block()?;
        let base = block * FLASH_PAGES_PER_BLOCK;
        for (s, src) in source.iter().enumerate() {
            if let Some(k) = src {
                let from = versions[*k]
                    .segment_flash_page(s)
                    .expect("a source holds its segment");
                let data = &mut buf.as_mut_slice()[..FLASH_PAGE_BYTES];
                log.read_segment(from, data)?;
                log.write_segment(base + s as u64, data)?;
                out.segments_copied += 1;
            }
        }
        release_block(log, tokens, &newest);
        merged.flash_page = base;
        merged.valid = valid; // every segment at position 0 of the new block
        merged.status |= status::MAPPED;
    }
    for (k, v) in versions.iter().enumerate().skip(1) {
        release_block(log, tokens, v);
        table.free_version(run[k]);
        out.versions_freed += 1;
    }
    table.set(run[0], merged);
    out.chains_merged += 1;
    Ok(())
}

/// Merge the longest chains first until at most `target_used` version
/// entries are in use, discarding the oldest live tokens if merging alone
/// cannot get there. Stops after `max_chains` chains that merged something
/// (0: no limit) so a background caller can let faults through; returns whether it reached
/// the target.
pub fn collect(
    table: &mut Table,
    log: &mut Log,
    tokens: &mut Tokens,
    target_used: u64,
    max_chains: usize,
    buf: &mut AlignedBuf,
    out: &mut GcOutcome,
) -> Result<bool> {
    let mut budget = if max_chains == 0 {
        usize::MAX
    } else {
        max_chains
    };
    loop {
        if table.versions_used() <= target_used {
            return Ok(true);
        }
        let lengths: Vec<u16> = (0..table.pages())
            .map(|vpn| table.chain_len(vpn).min(u16::MAX as usize) as u16)
            .collect();
        let before = table.versions_used();
        for vpn in longest_first(&lengths) {
            let vpn = u64::from(vpn);
            if budget == 0 {
                return Ok(false);
            }
            // Only chains that had something to merge (and so maybe IO)
            // count against the budget; the rest cost a walk.
            let merged_before = out.chains_merged;
            merge_chain(table, log, tokens, vpn, buf, out)?;
            if out.chains_merged > merged_before {
                budget -= 1;
            }
            if table.versions_used() <= target_used {
                return Ok(true);
            }
        }
        if table.versions_used() == before || table.versions_used() > target_used {
            if !tokens.raise_horizon() {
                return Ok(table.versions_used() <= target_used);
            }
            out.tokens_discarded += 1;
        }
    }
}

//! Caches sized per layer type, from the plan: a paged KV cache for full-attention layers (pages shared by all
//! such layers through one block table per sequence), a ring of `window - 1` slots per sequence for sliding
//! layers, and the fixed conv + recurrent state per sequence for gated DeltaNet layers. Each sequence owns one slot
//! (`0..max_num_seqs`); slots and pages are handed out when a sequence joins and returned when it leaves.
//!
//! K/V elements are bf16 (the 2 bytes per element the plan's cache budget charges; the kernels widen them exactly in
//! registers), or f32 on the exact path, whose parity with an f32 reference needs them. Recurrent state is f32.

use kernels::attention::{self, AttnDims, KvSlice, KvSliceMut};
use kernels::gdn::GdnDims;
use planner::model::LayerKind;

use crate::model::kerr;
use crate::EngineError;

/// Tokens per page of the full-attention cache.
pub const PAGE_SIZE: usize = 16;

/// K or V elements of one layer.
enum Store {
    F32(Vec<f32>),
    Bf16(Vec<half::bf16>),
}

impl Store {
    fn zeros(n: usize, bf16: bool) -> Store {
        if bf16 {
            Store::Bf16(vec![half::bf16::ZERO; n])
        } else {
            Store::F32(vec![0.0; n])
        }
    }
    fn bytes(&self) -> u64 {
        match self {
            Store::F32(v) => v.len() as u64 * 4,
            Store::Bf16(v) => v.len() as u64 * 2,
        }
    }
    fn view(&self, r: std::ops::Range<usize>) -> KvSlice<'_> {
        match self {
            Store::F32(v) => KvSlice::F32(&v[r]),
            Store::Bf16(v) => KvSlice::Bf16(&v[r]),
        }
    }
    fn view_mut(&mut self, r: std::ops::Range<usize>) -> KvSliceMut<'_> {
        match self {
            Store::F32(v) => KvSliceMut::F32(&mut v[r]),
            Store::Bf16(v) => KvSliceMut::Bf16(&mut v[r]),
        }
    }
    fn len(&self) -> usize {
        match self {
            Store::F32(v) => v.len(),
            Store::Bf16(v) => v.len(),
        }
    }
}

enum LayerCache {
    Full {
        k: Store,
        v: Store,
    },
    Sliding {
        k: Store,
        v: Store,
        ring: usize,
    },
    Gdn {
        conv: Vec<f32>,
        state: Vec<f32>,
        conv_len: usize,
        state_len: usize,
    },
}

/// Every layer's cache for `slots` sequences.
pub struct Caches {
    layers: Vec<LayerCache>,
    tables: Vec<Vec<u32>>,
    free_pages: Vec<u32>,
    free_slots: Vec<usize>,
    row: usize,
    pub slots: usize,
    pub pages: usize,
    pub bytes: u64,
    /// Whether K/V are held in bf16 (else f32).
    pub bf16: bool,
}

/// Elements of `parts` multiplied, or an error naming `what`.
fn elems(parts: &[usize], what: &str) -> Result<usize, EngineError> {
    parts
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| EngineError::Unsupported(format!("the {what} cache size overflows")))
}

impl Caches {
    /// Caches for `slots` sequences of at most `max_len` tokens each, K/V in bf16 or f32.
    pub fn new(
        kinds: &[LayerKind],
        attn: &AttnDims,
        window: Option<usize>,
        gdn: Option<GdnDims>,
        slots: usize,
        max_len: usize,
        bf16: bool,
    ) -> Result<Caches, EngineError> {
        let row = elems(&[attn.kv_heads, attn.head_dim], "KV")?;
        let pages = elems(&[max_len.div_ceil(PAGE_SIZE), slots], "KV")?;
        let mut layers = Vec::with_capacity(kinds.len());
        let mut bytes = 0u64;
        for &kind in kinds {
            let l = match kind {
                LayerKind::FullAttention => {
                    let n = elems(&[pages, PAGE_SIZE, row], "KV")?;
                    LayerCache::Full {
                        k: Store::zeros(n, bf16),
                        v: Store::zeros(n, bf16),
                    }
                }
                LayerKind::SlidingAttention => {
                    let w = window.ok_or_else(|| {
                        EngineError::Unsupported("sliding layer without a window".into())
                    })?;
                    let ring = w.saturating_sub(1);
                    let n = elems(&[slots, ring, row], "sliding")?;
                    LayerCache::Sliding {
                        k: Store::zeros(n, bf16),
                        v: Store::zeros(n, bf16),
                        ring,
                    }
                }
                LayerKind::LinearAttention => {
                    let g = gdn.ok_or_else(|| {
                        EngineError::Unsupported("GDN layer without geometry".into())
                    })?;
                    let (conv_len, state_len) = (g.conv_state_len(), g.state_len());
                    LayerCache::Gdn {
                        conv: vec![0.0; elems(&[slots, conv_len], "conv state")?],
                        state: vec![0.0; elems(&[slots, state_len], "recurrent state")?],
                        conv_len,
                        state_len,
                    }
                }
            };
            bytes += match &l {
                LayerCache::Full { k, v } | LayerCache::Sliding { k, v, .. } => {
                    k.bytes() + v.bytes()
                }
                LayerCache::Gdn { conv, state, .. } => 4 * (conv.len() + state.len()) as u64,
            };
            layers.push(l);
        }
        Ok(Caches {
            layers,
            tables: vec![Vec::new(); slots],
            free_pages: (0..pages as u32).rev().collect(),
            free_slots: (0..slots).rev().collect(),
            row,
            slots,
            pages,
            bytes,
            bf16,
        })
    }

    /// Slot and page bookkeeping only, for a model whose caches live on a device (`bytes` of them there): the
    /// same admission (slots, pages of [`PAGE_SIZE`] tokens) with no host storage.
    pub fn bookkeeping(slots: usize, max_len: usize, bytes: u64) -> Result<Caches, EngineError> {
        let pages = elems(&[max_len.div_ceil(PAGE_SIZE), slots], "KV")?;
        Ok(Caches {
            layers: Vec::new(),
            tables: vec![Vec::new(); slots],
            free_pages: (0..pages as u32).rev().collect(),
            free_slots: (0..slots).rev().collect(),
            row: 0,
            slots,
            pages,
            bytes,
            bf16: false,
        })
    }

    /// Takes a free slot for a new sequence, with its states zeroed.
    pub fn acquire(&mut self) -> Option<usize> {
        let s = self.free_slots.pop()?;
        for l in &mut self.layers {
            if let LayerCache::Gdn {
                conv,
                state,
                conv_len,
                state_len,
            } = l
            {
                conv[s * *conv_len..(s + 1) * *conv_len].fill(0.0);
                state[s * *state_len..(s + 1) * *state_len].fill(0.0);
            }
        }
        Some(s)
    }

    /// Returns a sequence's slot and pages.
    pub fn release(&mut self, slot: usize) {
        let pages = std::mem::take(&mut self.tables[slot]);
        self.free_pages.extend(pages);
        if !self.free_slots.contains(&slot) {
            self.free_slots.push(slot);
        }
    }

    /// Makes sure `slot` has pages for `len` tokens; fails (taking nothing) when the cache is full.
    pub fn reserve(&mut self, slot: usize, len: usize) -> Result<(), EngineError> {
        let need = len
            .div_ceil(PAGE_SIZE)
            .saturating_sub(self.tables[slot].len());
        if need > self.free_pages.len() {
            return Err(EngineError::CacheFull {
                needed: need,
                free: self.free_pages.len(),
            });
        }
        for _ in 0..need {
            let p = self.free_pages.pop().expect("checked above");
            self.tables[slot].push(p);
        }
        Ok(())
    }

    pub fn free_pages(&self) -> usize {
        self.free_pages.len()
    }

    pub(crate) fn layer_mut(&mut self, li: usize) -> Result<LayerView<'_>, EngineError> {
        let layer = self
            .layers
            .get_mut(li)
            .ok_or_else(|| EngineError::Unsupported(format!("no cache for layer {li}")))?;
        Ok(LayerView {
            layer,
            tables: &self.tables,
            row: self.row,
        })
    }
}

/// One layer's cache with the block tables, for the duration of a layer's step.
pub(crate) struct LayerView<'a> {
    layer: &'a mut LayerCache,
    tables: &'a [Vec<u32>],
    row: usize,
}

impl LayerView<'_> {
    /// Stores the K/V row of position `pos` of `slot` (the page must be reserved).
    pub(crate) fn store(
        &mut self,
        d: &AttnDims,
        slot: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
        window: Option<usize>,
    ) -> Result<(), EngineError> {
        match (&mut *self.layer, window) {
            (LayerCache::Full { k: kc, v: vc }, None) => {
                let t = &self.tables[slot];
                let (nk, nv) = (kc.len(), vc.len());
                attention::paged_store(d, kc.view_mut(0..nk), PAGE_SIZE, t, pos, k)
                    .map_err(kerr)?;
                attention::paged_store(d, vc.view_mut(0..nv), PAGE_SIZE, t, pos, v).map_err(kerr)
            }
            (LayerCache::Sliding { k: kc, v: vc, ring }, Some(w)) => {
                if *ring == 0 {
                    return Ok(());
                }
                let n = *ring * self.row;
                let r = slot * n..(slot + 1) * n;
                attention::ring_store(d, kc.view_mut(r.clone()), w, 0, pos, k).map_err(kerr)?;
                attention::ring_store(d, vc.view_mut(r), w, 0, pos, v).map_err(kerr)
            }
            _ => Err(EngineError::Unsupported(
                "cache kind does not match the layer".into(),
            )),
        }
    }

    pub(crate) fn paged(
        &self,
        slot: usize,
    ) -> Result<(KvSlice<'_>, KvSlice<'_>, usize, &[u32]), EngineError> {
        match &*self.layer {
            LayerCache::Full { k, v } => Ok((
                k.view(0..k.len()),
                v.view(0..v.len()),
                PAGE_SIZE,
                &self.tables[slot],
            )),
            _ => Err(EngineError::Unsupported(
                "not a full-attention cache".into(),
            )),
        }
    }

    pub(crate) fn ring(&self, slot: usize) -> Result<(KvSlice<'_>, KvSlice<'_>), EngineError> {
        match &*self.layer {
            LayerCache::Sliding { k, v, ring } => {
                let n = ring * self.row;
                Ok((
                    k.view(slot * n..(slot + 1) * n),
                    v.view(slot * n..(slot + 1) * n),
                ))
            }
            _ => Err(EngineError::Unsupported("not a sliding cache".into())),
        }
    }

    pub(crate) fn gdn(&mut self, slot: usize) -> Result<(&mut [f32], &mut [f32]), EngineError> {
        match &mut *self.layer {
            LayerCache::Gdn {
                conv,
                state,
                conv_len,
                state_len,
            } => Ok((
                &mut conv[slot * *conv_len..(slot + 1) * *conv_len],
                &mut state[slot * *state_len..(slot + 1) * *state_len],
            )),
            _ => Err(EngineError::Unsupported("not a GDN state".into())),
        }
    }
}

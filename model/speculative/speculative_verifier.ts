// mlx_vlm/models/gemma4/speculative_verifier.py (mlx-vlm 0.7.10): Gemma4ExactSpeculativeVerifier,
// the block-verify forward mlx-vlm runs for Gemma 4 when text_config.exact_speculative_verify is
// set and the language model is called with speculative_verify=True (its DFlash / EAGLE-3
// round loops; the MTP loop does not use it). It re-implements the forward so that verifying K
// tokens at once reproduces K single-token steps: attention runs query by query against
// keys[:prefix + index + 1], and the tied LM head runs token by token.
//
// As on the CPU (and any non-Metal) backend: the dense linears are the plain Linear calls (the
// exact GEMV kernels are Metal kernels, absent here), the embedding head is `timewise`
// (as_linear per position, concatenated). Ported as it computes, including what it leaves out:
//   - per-layer inputs are passed as None to every layer (E2B / E4B skip their per-layer gate);
//   - an MoE layer runs only its dense MLP (router and experts are skipped);
//   - with a cache list shorter than the layers (KV-shared models), Python's zip stops at the
//     last cache: the KV-shared layers do not run;
//   - the per-query attention passes no mask, so past a sliding window a query attends over the
//     whole resident prefix (its window is not applied).
// The parity suite holds this port bit-exact against mlx-vlm's class, and shows where it departs
// from the ordinary forward.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../cache/index.ts";
import type { Attention, DecoderLayer, KV, MLP, Model as TargetModel, Offset } from "../gemma4/gemma4_text.ts";
import { geglu, logit_softcap } from "../gemma4/gemma4_text.ts";
import type { AnyEmbedding } from "../gemma4/gemma4_text.ts";
import { disposeMask, type Mask } from "../mask.ts";

function seq(x: MlxArray, stop: number): MlxArray {
  const s = x.shape;
  return mx.slice(x, [0, 0, 0, 0], [s[0]!, s[1]!, stop, s[3]!]);
}

export class Gemma4ExactSpeculativeVerifier {
  /** `_embedding_as_linear` (timewise off Metal): as_linear per position, concatenated along L. */
  private embeddingAsLinear(embedding: AnyEmbedding, x: MlxArray): MlxArray {
    const [B, L, D] = x.shape as [number, number, number];
    if (!(x.ndim === 3 && (B > 1 || L > 1))) return embedding.asLinear(x);
    const parts: MlxArray[] = [];
    try {
      for (let i = 0; i < L; i++) {
        using xi = mx.slice(x, [0, i, 0], [B, i + 1, D]);
        using c = mx.contiguous(xi);
        parts.push(embedding.asLinear(c));
      }
      return mx.concatenate(parts, 1);
    } finally {
      for (const p of parts) p.dispose();
    }
  }

  private attention(attention: Attention, x: MlxArray, mask: Mask, cache: KVCacheLike | null, shared_kv: KV | null, offset: Offset | null): [MlxArray, KV, Offset] {
    using stack = new DisposableStack();
    const [B, L] = x.shape as [number, number];
    const { n_heads, n_kv_heads, head_dim } = attention;
    const q = stack.use(attention.q_proj.call(x));
    const qr = stack.use(mx.reshape(q, [B, L, n_heads, head_dim]));
    const queries0 = stack.use(attention.q_norm.call(qr));
    let keys: MlxArray;
    let values: MlxArray;
    let off: Offset;
    if (shared_kv !== null) {
      keys = mx.alias(shared_kv[0]);
      values = mx.alias(shared_kv[1]);
      off = offset instanceof mx.MlxArray ? mx.alias(offset) : (offset ?? 0);
    } else {
      const kp = stack.use(attention.k_proj!.call(x));
      const k = stack.use(mx.reshape(kp, [B, L, n_kv_heads, head_dim]));
      let v = k;
      if (!attention.use_k_eq_v) {
        const vp = stack.use(attention.v_proj!.call(x));
        v = stack.use(mx.reshape(vp, [B, L, n_kv_heads, head_dim]));
      }
      off = cache !== null ? mx.array(cache.offset) : 0;
      const kn = stack.use(attention.k_norm!.call(k));
      const kt = stack.use(mx.transpose(kn, [0, 2, 1, 3]));
      keys = attention.rope.call(kt, off);
      const vn = stack.use(attention.v_norm!.call(v));
      values = mx.transpose(vn, [0, 2, 1, 3]);
      if (cache !== null) {
        const [ck, cv] = cache.updateAndFetch(keys, values);
        keys.dispose();
        values.dispose();
        keys = ck;
        values = cv;
      }
    }
    const kv: KV = [keys, values];
    try {
      const qt = stack.use(mx.transpose(queries0, [0, 2, 1, 3]));
      const queries = stack.use(attention.rope.call(qt, off));
      let output: MlxArray;
      if (L > 1) {
        const prefix = keys.shape[2]! - L;
        const rows: MlxArray[] = [];
        try {
          for (let i = 0; i < L; i++) {
            using qi = mx.slice(queries, [0, 0, i, 0], [B, n_heads, i + 1, head_dim]);
            using ki = seq(keys, prefix + i + 1);
            using vi = seq(values, prefix + i + 1);
            rows.push(mx.fast.scaledDotProductAttention(qi, ki, vi, { scale: attention.scale, mask: null }));
          }
          output = stack.use(mx.concatenate(rows, 2));
        } finally {
          for (const r of rows) r.dispose();
        }
      } else {
        output = stack.use(mx.fast.scaledDotProductAttention(queries, keys, values, { scale: attention.scale, mask }));
      }
      const ot = stack.use(mx.transpose(output, [0, 2, 1, 3]));
      const or = stack.use(mx.reshape(ot, [B, L, -1]));
      return [attention.o_proj.call(or), kv, off];
    } catch (e) {
      keys.dispose();
      values.dispose();
      if (off instanceof mx.MlxArray) off.dispose();
      throw e;
    }
  }

  private feedForward(mlp: MLP, x: MlxArray): MlxArray {
    using gate = mlp.gate_proj.call(x);
    using up = mlp.up_proj.call(x);
    using g = geglu(gate, up);
    return mlp.down_proj.call(g);
  }

  private layer(layer: DecoderLayer, x: MlxArray, mask: Mask, cache: KVCacheLike | null, shared_kv: KV | null, offset: Offset | null): [MlxArray, KV, Offset] {
    using stack = new DisposableStack();
    const hn = stack.use(layer.input_layernorm.call(x));
    const [attn, kv, off] = this.attention(layer.self_attn, hn, mask, cache, shared_kv, offset);
    try {
      stack.use(attn);
      const pa = stack.use(layer.post_attention_layernorm.call(attn));
      const hidden = stack.use(mx.add(x, pa));
      const pre = stack.use(layer.pre_feedforward_layernorm.call(hidden));
      // MoE layers: layer.mlp only (Python's `getattr(layer, "enable_moe")` branch)
      const inner = stack.use(this.feedForward(layer.mlp, pre));
      const pf = stack.use(layer.post_feedforward_layernorm.call(inner));
      const h2 = stack.use(mx.add(hidden, pf));
      // per_layer_input is None for every layer here, so only layer_scalar applies
      return [mx.multiply(h2, layer.layer_scalar), kv, off];
    } catch (e) {
      kv[0].dispose();
      kv[1].dispose();
      if (off instanceof mx.MlxArray) off.dispose();
      throw e;
    }
  }

  /** __call__(language_model, inputs, cache=..., input_embeddings=...) → logits (B, L, V). */
  call(target: TargetModel, inputs: MlxArray | null, { cache = null, input_embeddings = null }: { cache?: KVCacheLike[] | null; input_embeddings?: MlxArray | null } = {}): MlxArray {
    using stack = new DisposableStack();
    const model = target.model;
    let hidden: MlxArray;
    if (input_embeddings !== null) hidden = stack.use(mx.alias(input_embeddings));
    else {
      const e = stack.use(model.embed_tokens.call(inputs!));
      hidden = stack.use(mx.multiply(e, model.embed_scale));
    }
    // zip(model.layers, cache, masks, previous_kvs): a shorter cache list ends the loop early.
    const caches: (KVCacheLike | null)[] = cache ?? model.layers.map(() => null);
    const n = Math.min(model.layers.length, caches.length);
    const masks = model._make_masks(hidden, caches.slice(0, n)).slice(0, n);
    for (const m of new Set(masks)) stack.defer(() => disposeMask(m));
    // every layer's (kvs, offset), for the KV-shared layers; owned by the stack
    const intermediates: [KV | null, Offset | null][] = model.layers.map(() => [null, null]);
    for (let i = 0; i < n; i++) {
      const [kvs, offset] = intermediates[model.previous_kvs[i]!]!;
      const [h, kv, off] = this.layer(model.layers[i]!, hidden, masks[i]!, caches[i]!, kvs, offset);
      hidden = stack.use(h);
      stack.use(kv[0]);
      stack.use(kv[1]);
      if (off instanceof mx.MlxArray) stack.use(off);
      intermediates[i] = [kv, off];
    }
    const normed = stack.use(model.norm.call(hidden));
    const logits = this.embeddingAsLinear(model.embed_tokens, normed);
    if (target.final_logit_softcapping === null) return logits;
    using l = logits;
    return logit_softcap(target.final_logit_softcapping, l);
  }
}

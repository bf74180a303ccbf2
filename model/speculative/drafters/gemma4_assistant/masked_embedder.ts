// mlx_vlm/speculative/drafters/gemma4_assistant/masked_embedder.py (mlx-vlm 0.7.10): the
// centroid-routed sparse LM head of the E2B / E4B drafters. `centroids` scores num_centroids token
// clusters; the top-k clusters' tokens (token_ordering holds each cluster's canonical ids) are
// scored densely against the embedding rows; every other token gets min(selected) - 1.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { Linear, Module, placeholder } from "../../../gemma4/nn.ts";
import type { Gemma4AssistantConfig } from "./config.ts";

export class MaskedEmbedder extends Module {
  readonly hidden_size: number;
  readonly vocab_size: number;
  readonly num_centroids: number;
  readonly top_k: number;
  readonly vocab_size_per_centroid: number;
  centroids: Linear;
  /** A static checkpoint buffer (int32 after sanitize), not a learnable parameter. */
  token_ordering: MlxArray;

  constructor(config: Gemma4AssistantConfig) {
    super();
    const t = config.text_config;
    this.hidden_size = t.hidden_size;
    this.vocab_size = t.vocab_size;
    this.num_centroids = config.num_centroids;
    this.top_k = config.centroid_intermediate_top_k;
    this.vocab_size_per_centroid = Math.floor(this.vocab_size / this.num_centroids);
    this.centroids = new Linear(this.hidden_size, this.num_centroids);
    this.token_ordering = placeholder([this.vocab_size], "int32");
  }

  /** Full-vocab logits (B, L, V): the selected tokens' scores, min(selected) - 1 elsewhere. */
  call(hidden: MlxArray, lmHeadWeight: MlxArray): MlxArray {
    const [B, L] = hidden.shape as [number, number];
    const [canonical, logits] = this.selectedLogits(hidden, lmHeadWeight);
    using _c = canonical;
    using _l = logits;
    using mn = mx.min(logits);
    const maskValue = (mn.item() as number) - 1.0;
    using scatterIdx = mx.reshape(canonical, [B, L, -1]);
    using out = mx.full([B, L, this.vocab_size], mx.pyFloat(maskValue), hidden.dtype);
    return mx.putAlongAxis(out, scatterIdx, logits, -1);
  }

  /** Greedy tokens (B, L) without materializing full-vocab logits. */
  argmax(hidden: MlxArray, lmHeadWeight: MlxArray): MlxArray {
    const [B, L] = hidden.shape as [number, number];
    const [canonical, logits] = this.selectedLogits(hidden, lmHeadWeight);
    using _c = canonical;
    using _l = logits;
    using am = mx.argmax(logits, -1);
    using best = mx.expandDims(am, -1);
    using sc = mx.reshape(canonical, [B, L, -1]);
    using picked = mx.takeAlongAxis(sc, best, -1);
    return mx.squeeze(picked, -1);
  }

  private selectedLogits(hidden: MlxArray, lmHeadWeight: MlxArray): [MlxArray, MlxArray] {
    const [B, L] = hidden.shape as [number, number];
    const k = this.top_k;
    using centroidLogits = this.centroids.call(hidden);
    using part = mx.argpartition(centroidLogits, -k, -1);
    const s = part.shape;
    using topk = mx.slice(part, s.map((d, i) => (i === s.length - 1 ? d - k : 0)), s); // [..., -top_k:]
    using ordering = mx.reshape(this.token_ordering, [this.num_centroids, this.vocab_size_per_centroid]);
    const canonical = mx.take(ordering, topk, 0); // ordering[topk_idx]: (B, L, top_k, vsc)
    try {
      using flat = mx.reshape(canonical, [-1]);
      using rows = mx.take(lmHeadWeight, flat, 0);
      using emb = mx.reshape(rows, [B, L, k * this.vocab_size_per_centroid, this.hidden_size]);
      using h = mx.expandDims(hidden, -2);
      using et = mx.swapaxes(emb, -1, -2);
      using mm = mx.matmul(h, et);
      return [canonical, mx.squeeze(mm, -2)];
    } catch (e) {
      canonical.dispose();
      throw e;
    }
  }
}

// Test fixtures built from the text fixtures by the oracle's relayered_fixture command
// (oracle/python/kv_quant_ref.py): other layer types, with a full-attention layer's weights copied
// where a layer becomes full attention (the head dims of the two kinds differ).
// - all-full: c1_dense with every layer full attention (layer 2's weights at every index): the
//   shape where mlx-vlm's uniform scheme runs on the single-sequence path;
// - e2b-q: c3_e2b (KV sharing, per-layer inputs) with layer 0 full attention (layer 3's weights):
//   a full-attention layer that is neither the last cache nor a KV-sharing donor, so TurboQuant
//   and the batch path quantize it (c3_e2b and c4_e4b themselves, like real E2B/E4B, have only
//   the last cache as non-shared full attention, which neither path quantizes).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";

const CK = join(REPO_ROOT, ".cache", "checkpoints");

export interface Relayered {
  dir: string;
  /** the oracle job that writes it */
  job: Record<string, unknown>;
  remove(): void;
}

function relayered(prefix: string, src: string, layerTypes: string[], copy: Record<number, number>): Relayered {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return {
    dir,
    job: { command: "relayered_fixture", src: join(CK, src), dst: dir, layer_types: layerTypes, copy },
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export const allFullFixture = (): Relayered => relayered("kvq-allfull-", "c1_dense/f32", Array(6).fill("full_attention"), { 0: 2, 1: 2, 2: 2, 3: 2, 4: 2, 5: 2 });

const S = "sliding_attention";
const F = "full_attention";
export const e2bQuantizedFixture = (): Relayered => relayered("kvq-e2bq-", "c3_e2b/f32", [F, S, S, F, S, S, S, F], { 0: 3 });

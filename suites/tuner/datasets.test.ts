// The datasets against mlx-lm's (a tiny word-level tokenizer made with the tokenizers library,
// BOS from its post-processor, a chat template): text, chat and completions records, with and
// without mask_prompt, give the same (tokens, offset) and itemlen per split; iterate_batches over
// a CacheDataset sorts by the raw records' key counts as mlx-lm does; text + mask_prompt and an
// unknown format fail with mlx-lm's message.

import { afterAll, describe, expect, it } from "vitest";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CacheDataset, type DatasetConfig, load_local_dataset, loadTokenizer } from "../../model/tuner/datasets.ts";
import { RandomState } from "../../model/tuner/np_random.ts";
import { iterate_batches } from "../../model/tuner/trainer.ts";
import { firstMismatch, readMeta, readTensors, runTunerRef } from "./ref.ts";

const tmp = mkdtempSync(join(tmpdir(), "tuner-data-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const TEXT = [
  { text: "why is the sky blue ?" },
  { text: "the cat and the dog .", id: 7 },
  { text: "red green tree\nwater fire stone" },
  { text: "a" },
  { text: "one two three , old man river hill !", source: "x", lang: "en" },
  { text: "" + "the ".repeat(40) + "end" },
];
const CHAT = [
  { messages: [{ role: "user", content: "why is the sky blue ?" }, { role: "assistant", content: "the water ." }] },
  { messages: [{ role: "system", content: "be good" }, { role: "user", content: "red tree" }, { role: "assistant", content: "green tree" }] },
  { messages: [{ role: "user", content: "hill" }] },
];
const COMPLETIONS = [
  { prompt: "why is the sky blue ?", completion: "the water" },
  { prompt: "one", completion: "two three" },
];

function writeData(name: string, splits: Record<string, object[]>): string {
  const dir = join(tmp, name);
  mkdirSync(dir, { recursive: true });
  for (const [split, recs] of Object.entries(splits)) writeFileSync(join(dir, `${split}.jsonl`), recs.map((r) => JSON.stringify(r)).join("\n") + "\n");
  return dir;
}

const CASES: { name: string; splits: Record<string, object[]>; config: DatasetConfig; error?: RegExp }[] = [
  { name: "text / chat / completions", splits: { train: TEXT, valid: CHAT, test: COMPLETIONS }, config: {} },
  { name: "chat / completions with mask_prompt", splits: { train: CHAT.slice(0, 2), valid: COMPLETIONS }, config: { mask_prompt: true } },
  { name: "text with mask_prompt fails", splits: { train: TEXT }, config: { mask_prompt: true }, error: /Prompt masking not supported for text dataset/ },
  { name: "an unknown format fails", splits: { train: [{ body: "x" }] }, config: {}, error: /Unsupported data format/ },
];

const tokDir = join(tmp, "tok");
const dirs = CASES.map((c, i) => writeData(`d${i}`, c.splits));
runTunerRef([
  { kind: "tokenizer", out: tokDir },
  ...CASES.map((c, i) => ({ kind: "datasets", tokenizer: tokDir, data: dirs[i], config: c.config, out: join(tmp, `o${i}`) })),
  { kind: "batches", tokenizer: tokDir, data_dir: dirs[0], batch_size: 2, max_seq_length: 2048, take: 3, seed_batches: 4, out: join(tmp, "batches") },
]);
const tokenizer = await loadTokenizer(tokDir);

describe("datasets vs mlx-lm", () => {
  CASES.forEach((c, i) => {
    it(c.name, () => {
      const meta = readMeta<{ error?: string; splits?: Record<string, { tokens: number[]; offset: number; itemlen: number }[]>; eos_token_id?: number }>(join(tmp, `o${i}`));
      if (c.error) {
        expect(meta.error).toMatch(c.error);
        expect(() => load_local_dataset(dirs[i]!, tokenizer, c.config)).toThrow(c.error);
        return;
      }
      expect(tokenizer.eos_token_id).toBe(meta.eos_token_id!);
      const splits = load_local_dataset(dirs[i]!, tokenizer, c.config);
      ["train", "valid", "test"].forEach((name, k) => {
        const ds = new CacheDataset(splits[k]!);
        const ours = Array.from({ length: ds.length }, (_, j) => ({ tokens: [...ds.get(j)[0]], offset: ds.get(j)[1], itemlen: ds.itemlen(j) }));
        expect(ours).toEqual(meta.splits![name]!);
      });
    });
  });

  it("iterate_batches over a CacheDataset (sorted by record key count)", () => {
    const ds = new CacheDataset(load_local_dataset(dirs[0]!, tokenizer)[0]);
    const ours: [string, ReturnType<typeof readTensors> extends Map<string, infer T> ? T : never][] = [];
    const gen = iterate_batches(ds, { batch_size: 2, max_seq_length: 2048, seed: 4, rng: new RandomState(0) });
    for (let b = 0; b < 3; b++) {
      const [batch, lengths] = gen.next().value!;
      ours.push([`${b}.batch`, { dtype: batch.dtype, shape: batch.shape, data: batch.toBytes() }]);
      ours.push([`${b}.lengths`, { dtype: lengths.dtype, shape: lengths.shape, data: lengths.toBytes() }]);
      batch.dispose();
      lengths.dispose();
    }
    const bad = firstMismatch(ours, readTensors(join(tmp, "batches", "batches.safetensors")));
    if (bad) throw new Error(bad);
  });
});

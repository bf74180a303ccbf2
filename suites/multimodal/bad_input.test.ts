// Bad media input, model side: a placeholder count that does not match the media, and media for
// a tower the checkpoint lacks. mlx-vlm silently wraps (or drops) features and crashes on a
// missing tower; the port refuses with one MediaError naming what is wrong, and the faces exit 2.
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { MM_MEDIA, fixtureImages, type ImageSpec } from "../../oracle/mm_fixtures.ts";
import { loadMultimodalModel, MediaError } from "../../model/gemma4/index.ts";
import { CKPT_ROOT } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "mm-bad-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const IMG = MM_MEDIA.img_a as ImageSpec; // 9 soft tokens
const [BOI, IMAGE, EOI] = [252, 250, 253];

function forward(ckpt: string, ids: number[], media: { image?: boolean; audio?: boolean }): void {
  const { model } = loadMultimodalModel(ckpt);
  try {
    using x = mx.array(Int32Array.from(ids), [1, ids.length], "int32");
    const pv = media.image ? (fixtureImages([IMG]) as mx.MlxArray) : null;
    using feats = media.audio ? mx.zeros([1, 101, 128]) : null;
    try {
      using logits = model.call(x, { pixel_values: pv, input_features: feats });
    } finally {
      pv?.dispose();
    }
  } finally {
    model.dispose();
  }
}

describe("placeholder counts", () => {
  it("more image placeholders than features: mlx-vlm runs (it wraps the features around), the port refuses", async () => {
    const prompt = [2, 17, BOI, ...Array<number>(11).fill(IMAGE), EOI, 5];
    // mlx-vlm itself, on the same prompt (its 9 placeholders plus 2 more): no complaint, the last
    // two placeholders get feature rows 0 and 1 again (masked_scatter's index % source.size)
    const o = await sharedOracle();
    const cap = await o.request<{ taps: { name: string; shape?: number[] }[] }>("capture", {
      checkpoint: "m1_dense/f32",
      scenario: { id: "mm_wrap_repro", kind: "forward", needs: ["vision"], prompt: [2, 17, "img_a", IMAGE, IMAGE, 5] },
      mode: "logits",
      only: [],
    });
    expect(cap.taps.find((t) => t.name === "logits")?.shape).toEqual([1, 16, 256]);
    expect(() => forward(join(CKPT_ROOT, "m1_dense/f32"), prompt, { image: true })).toThrow(
      /the prompt has 11 image placeholder tokens \(id 250\) but the image input gives 9 feature rows.*mlx-vlm would silently wrap the features around/,
    );
  }, limit(120_000));

  it("fewer placeholders than features, and placeholders without an image", () => {
    const ck = join(CKPT_ROOT, "m1_dense/f32");
    expect(() => forward(ck, [2, BOI, ...Array<number>(7).fill(IMAGE), EOI], { image: true })).toThrow(/7 image placeholder tokens .* 9 feature rows.*drop the extra features/);
    expect(() => forward(ck, [2, BOI, IMAGE, IMAGE, EOI], {})).toThrow(/2 image placeholder tokens .* 0 feature rows/);
  });
});

describe("media without their tower", () => {
  it("audio for a checkpoint whose audio_config is null", () => {
    expect(() => forward(join(CKPT_ROOT, "m1_dense/f32"), [2, 5], { audio: true })).toThrow(MediaError);
    expect(() => forward(join(CKPT_ROOT, "m1_dense/f32"), [2, 5], { audio: true })).toThrow(/audio input given, but this checkpoint has no audio tower/);
  });

  it("audio for a checkpoint whose config has an audio tower but whose weights do not (mlx-vlm drops the tower)", () => {
    const src = join(CKPT_ROOT, "m2_e2b/f32");
    const d = join(tmp, "no-audio");
    rmSync(d, { recursive: true, force: true });
    spawnSync("mkdir", ["-p", d]);
    copyFileSync(join(src, "config.json"), join(d, "config.json"));
    const w = mx.loadSafetensors(join(src, "model.safetensors"));
    const kept = new Map([...w.arrays].filter(([k]) => !k.startsWith("audio_tower.") && !k.startsWith("embed_audio.")));
    mx.saveSafetensors(join(d, "model.safetensors"), kept, { format: "mlx" });
    for (const a of w.arrays.values()) a.dispose();
    const { model } = loadMultimodalModel(d);
    expect(model.audio_tower).toBeNull();
    expect(model.embed_audio).toBeNull();
    model.dispose();
    expect(() => forward(d, [2, 5], { audio: true })).toThrow(/audio input given, but this checkpoint has no audio tower/);
  });
});

describe("the faces", () => {
  const run = (face: string, args: string[]) => {
    const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", face), ...args], { cwd: REPO_ROOT, encoding: "utf8", timeout: limit(120_000) });
    return { code: r.status, out: `${r.stdout}${r.stderr}` };
  };
  const img = join(tmp, "x.png");
  writeFileSync(img, readFileSync(join(REPO_ROOT, "parity", "testdata", "make_outside.py"))); // any readable file: checks run before decoding
  for (const face of ["cli.ts", "generate_cli.ts"]) {
    it(`${face}: a tower the checkpoint lacks, a missing file, a marker count that does not match: exit 2, one line`, () => {
      const ck = join(CKPT_ROOT, "m1_dense/f32");
      const cases: [string[], RegExp][] = [
        [["--model", ck, "--audio", img, "--tokens", "2,audio,5"], /--audio given, but .* has no audio tower \(audio_config is null\)/],
        [["--model", ck, "--image", join(tmp, "nope.png"), "--tokens", "2,image,5"], /--image: file not found/],
        [["--model", ck, "--image", img, "--tokens", "2,image,image,5"], /the prompt has 2 image placeholders but --image gives 1 file/],
        [["--model", join(CKPT_ROOT, "c1_dense/f32"), "--image", img, "--tokens", "2,image,5"], /is a gemma4_text checkpoint: media need a gemma4 checkpoint/],
      ];
      for (const [args, msg] of cases) {
        const r = run(face, args);
        expect(r.out).toMatch(msg);
        expect(r.code).toBe(2);
        expect(r.out).not.toMatch(/\n\s+at .+:\d+:\d+/);
      }
    }, limit(120_000));
  }
});

// Training runs compared step by step against the reference's dump (oracle/python/tuner_ref.py
// "train" jobs: per step {i}.loss, {i}.ntoks, {i}.grad.<path>, {i}.param.<path>, {i}.opt.<path>):
// every tensor byte for byte, and the first divergence named by step, kind and parameter path,
// as the forward taps name the first divergent tap. Within a step the order is the step's own:
// loss, ntoks, gradients (tree order; the backward-order first is reported too), the parameters
// after the update, the optimizer state.
import type { MlxArray } from "@mlx-bun/mlx";
import { type Tree, treeFlatten } from "@mlx-bun/mlx/utils";
import { rawOf } from "./compare.ts";
import { compareGrads } from "./grad_compare.ts";
import { compareRaw, formatDiff, type RawTensor, type TensorDiff } from "./tensor_diff.ts";

export type StepKind = "loss" | "ntoks" | "grad" | "param" | "opt";

export interface StepDivergence {
  step: number;
  kind: StepKind;
  /** The parameter path (or "loss" / "ntoks"). */
  path: string;
  diff: TensorDiff;
  /** For gradients: the divergent one the backward pass computes first (latest in tree order). */
  firstBackward?: TensorDiff;
}

export interface StepTensors {
  loss: MlxArray;
  ntoks: MlxArray;
  /** Absent where the reference has none (the compiled step does not expose them). */
  grads?: Tree<MlxArray>;
  params: Tree<MlxArray> | ReadonlyMap<string, MlxArray>;
  opt: Tree<MlxArray>;
}

function flat(t: Tree<MlxArray> | ReadonlyMap<string, MlxArray>): [string, MlxArray][] {
  return t instanceof Map ? [...t] : treeFlatten<MlxArray>(t as Tree<MlxArray>);
}

export class TrainComparison {
  /** Tensors compared / bit-exact, per kind. */
  readonly counts: Record<StepKind, { compared: number; equal: number }> = {
    loss: { compared: 0, equal: 0 },
    ntoks: { compared: 0, equal: 0 },
    grad: { compared: 0, equal: 0 },
    param: { compared: 0, equal: 0 },
    opt: { compared: 0, equal: 0 },
  };
  first: StepDivergence | null = null;
  /** Paths the reference has for a step that the port did not give, and the reverse. */
  readonly missing: string[] = [];
  readonly extra: string[] = [];

  constructor(private readonly reference: ReadonlyMap<string, RawTensor>) {}

  private note(step: number, kind: StepKind, path: string, diff: TensorDiff, firstBackward?: TensorDiff): void {
    this.counts[kind].compared++;
    if (diff.equal) this.counts[kind].equal++;
    else if (this.first === null) this.first = { step, kind, path, diff, ...(firstBackward ? { firstBackward } : {}) };
  }

  private tree(step: number, kind: "param" | "opt", t: Tree<MlxArray> | ReadonlyMap<string, MlxArray>): void {
    const prefix = `${step}.${kind}.`;
    const mine = flat(t);
    const seen = new Set<string>();
    for (const [path, a] of mine) {
      seen.add(path);
      const want = this.reference.get(prefix + path);
      if (!want) {
        this.extra.push(prefix + path);
        continue;
      }
      this.note(step, kind, path, compareRaw(path, rawOf(a), want));
    }
    for (const k of this.reference.keys()) if (k.startsWith(prefix) && !seen.has(k.slice(prefix.length))) this.missing.push(k);
  }

  /** Compares one step; returns this step's first divergence (null when all of it is bit-exact). */
  step(step: number, t: StepTensors): StepDivergence | null {
    const before = this.first;
    for (const kind of ["loss", "ntoks"] as const) {
      const want = this.reference.get(`${step}.${kind}`);
      if (!want) this.missing.push(`${step}.${kind}`);
      else this.note(step, kind, kind, compareRaw(kind, rawOf(t[kind]), want));
    }
    if (t.grads !== undefined) {
      const prefix = `${step}.grad.`;
      const ref = [...this.reference].filter(([k]) => k.startsWith(prefix)).map(([k, v]) => [k.slice(prefix.length), v] as const);
      const c = compareGrads(t.grads, ref);
      this.missing.push(...c.missing.map((p) => prefix + p));
      this.extra.push(...c.extra.map((p) => prefix + p));
      for (const d of c.diffs) this.note(step, "grad", d.name, d, d === c.first ? (c.firstBackward ?? undefined) : undefined);
    }
    this.tree(step, "param", t.params);
    this.tree(step, "opt", t.opt);
    return this.first !== before ? this.first : null;
  }

  get ok(): boolean {
    return this.first === null && this.missing.length === 0 && this.extra.length === 0;
  }

  /** One paragraph: counts per kind, the first divergence by step and path, missing/extra paths. */
  summary(): string {
    const parts = (Object.keys(this.counts) as StepKind[]).map((k) => `${k} ${this.counts[k].equal}/${this.counts[k].compared}`);
    const lines = [`bit-exact: ${parts.join(", ")}`];
    if (this.first) {
      const f = this.first;
      lines.push(`first divergence: step ${f.step}, ${f.kind} ${f.path}: ${formatDiff(f.diff)}`);
      if (f.firstBackward && f.firstBackward.name !== f.path) lines.push(`  first in backward order: ${formatDiff(f.firstBackward)}`);
    }
    if (this.missing.length) lines.push(`missing on the TS side: ${this.missing.slice(0, 5).join(", ")}${this.missing.length > 5 ? ", …" : ""}`);
    if (this.extra.length) lines.push(`not in the reference: ${this.extra.slice(0, 5).join(", ")}${this.extra.length > 5 ? ", …" : ""}`);
    return lines.join("\n");
  }
}

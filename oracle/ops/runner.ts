// Runs op parity cases: seeded inputs → the binding and Python MLX (through the oracle) →
// byte comparison of every output (dtype, shape and raw bytes).
import * as mx from "@mlx-bun/mlx";
import type { Dtype, MlxArray } from "@mlx-bun/mlx";
import type { Operand } from "@mlx-bun/mlx/ops";
import type { ArraySpec, Gen, InputSpec, OpCase, View } from "./cases.ts";
import type { OpInput, OracleClient, OracleError } from "../client.ts";
import type { NpyRecord } from "../npy.ts";
import { type MlxBug, mlxBugForOp } from "../mlx_bugs.ts";

/**
 * exact: every output byte-identical. unsupported: both sides rejected the case with the same
 * MLX error (a fact about the backend, e.g. float64 on a GPU), counted apart from exact and from
 * failures. mlx-bug: a byte difference on a case that takes a path of MLX's own proven broken on
 * this backend (oracle/mlx_bugs.ts, with its Python-only reproducer), counted apart too. fail:
 * anything else (a byte difference, one side failing, or different errors).
 */
export type CaseStatus = "exact" | "unsupported" | "mlx-bug" | "fail";

export interface CaseResult {
  id: string;
  op: string;
  status: CaseStatus;
  /** status === "exact" */
  ok: boolean;
  detail?: string;
  /** The case left a sticky error behind (the process could no longer run ops): both were restarted. */
  sticky?: boolean;
  /** status === "mlx-bug": which one */
  mlxBug?: MlxBug;
}

// ---------------------------------------------------------------- seeded inputs

function hash32(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const isFloatDt = (d: Dtype) => d === "float32" || d === "float16" || d === "bfloat16" || d === "float64";
const isUnsigned = (d: Dtype) => d.startsWith("uint");

function values(gen: Gen, n: number, dt: Dtype, rnd: () => number): number[] {
  const out = new Array<number>(n);
  const normal = () => Math.sqrt(-2 * Math.log(1 - rnd())) * Math.cos(2 * Math.PI * rnd());
  const int = (lo: number, hi: number) => lo + Math.floor(rnd() * (hi - lo + 1));
  for (let i = 0; i < n; i++) {
    let v: number;
    if (typeof gen === "object") {
      if ("index" in gen) v = int(0, gen.index - 1);
      else if ("range" in gen) v = int(gen.range[0], gen.range[1]);
      else v = gen.values[i % gen.values.length]!;
    } else {
      switch (gen) {
        case "normal": v = normal(); break;
        case "wide": v = 3 * normal(); break;
        case "small": v = -2 + 4 * rnd(); break;
        case "positive": v = 0.1 + 2.9 * rnd(); break;
        case "unit": v = -0.95 + 1.9 * rnd(); break;
        case "ge1": v = 1 + 3 * rnd(); break;
        case "int": v = isUnsigned(dt) ? int(0, 40) : int(-20, 20); break;
        case "nonzero": v = isUnsigned(dt) ? int(1, 40) : (rnd() < 0.5 ? -1 : 1) * int(1, 20); break;
        case "shift": v = int(0, 7); break;
        case "bool": v = rnd() < 0.5 ? 1 : 0; break;
        case "bits": v = 0; break;
      }
    }
    out[i] = v;
  }
  return out;
}

/** The stored bytes of an array input (before its view). */
export function inputBytes(spec: ArraySpec, seed: string): Uint8Array {
  const n = spec.shape.reduce((a, b) => a * b, 1);
  const rnd = mulberry32(hash32(seed));
  const gen: Gen = spec.gen ?? (spec.dtype === "bool" ? "bool" : isFloatDt(spec.dtype) ? "normal" : "int");
  if (gen === "bits") {
    const out = new Uint8Array(n * mx.itemSize(spec.dtype));
    for (let i = 0; i < out.length; i++) out[i] = Math.floor(rnd() * 256);
    return out;
  }
  const vals = values(gen, n, spec.dtype, rnd);
  // converted by MLX on its CPU device, whatever the default: the same bytes on every backend,
  // and a GPU that refuses a dtype (float64 on CUDA) must still get the case, to refuse it there
  const device = mx.defaultDevice();
  mx.setDefaultDevice("cpu");
  try {
    if (isFloatDt(spec.dtype)) {
      // float32 values (every generator is exact in f32), converted by MLX itself for f16/bf16/f64
      using f = mx.fromBytes(new Float32Array(vals), spec.shape, "float32");
      if (spec.dtype === "float32") return f.toBytes();
      using c = mx.astype(f, spec.dtype);
      return c.toBytes();
    }
    using a = mx.array(vals, spec.shape, spec.dtype);
    return a.toBytes();
  } finally {
    mx.setDefaultDevice(device);
  }
}

export function applyView(a: MlxArray, view: View | undefined): MlxArray {
  if (!view) return a;
  if ("transpose" in view) return view.transpose === null ? mx.transpose(a) : mx.transpose(a, view.transpose);
  return mx.slice(a, view.slice.start, view.slice.stop, view.slice.strides);
}

// ---------------------------------------------------------------- running

interface Prepared {
  /** The binding's operands, or the MLX error that refused them (a GPU refuses float64 arrays). */
  ts: Operand[] | Error;
  owned: MlxArray[];
  oracle: OpInput[];
  views: (View | null)[];
}

function prepare(c: OpCase): Prepared {
  const oracle: OpInput[] = [];
  const views: (View | null)[] = [];
  const bytes = c.inputs.map((spec: InputSpec, i) => {
    views.push("scalar" in spec ? null : (spec.view ?? null));
    if ("scalar" in spec) {
      // JSON has no inf/nan: send them as the strings Python's float() parses
      const wire = Number.isFinite(spec.scalar) ? spec.scalar : String(spec.scalar).replace("Infinity", "inf").replace("NaN", "nan");
      oracle.push({ scalar: wire as number, kind: spec.kind });
      return null;
    }
    const b = inputBytes(spec, `${c.id}|${i}`);
    oracle.push({ dtype: spec.dtype, shape: spec.shape, data: b });
    return b;
  });
  const ts: Operand[] = [];
  const owned: MlxArray[] = [];
  try {
    c.inputs.forEach((spec: InputSpec, i) => {
      if ("scalar" in spec) {
        ts.push(spec.kind === "bool" ? spec.scalar !== 0 : spec.kind === "int" ? mx.pyInt(spec.scalar) : mx.pyFloat(spec.scalar));
        return;
      }
      const base = mx.fromBytes(bytes[i]!, spec.shape, spec.dtype);
      owned.push(base);
      const v = applyView(base, spec.view);
      if (v !== base) owned.push(v);
      ts.push(v);
    });
  } catch (e) {
    if (!(e instanceof mx.MlxError)) throw e;
    for (const a of owned) a.dispose();
    // the oracle still gets the case: both sides refusing it alike is "unsupported"
    return { ts: e, owned: [], oracle, views };
  }
  return { ts, owned, oracle, views };
}

interface TsOut {
  dtype: Dtype;
  shape: number[];
  bytes: Uint8Array;
}

/** The MLX message of a failure on either side: the binding's MlxError detail, Python's str(e). */
function mlxMessage(e: Error): string {
  if (e instanceof mx.MlxError) return e.detail;
  const py = (e as OracleError).pythonMessage;
  return py ?? e.message;
}

function classify(ts: TsOut[] | Error, py: NpyRecord[] | Error): { status: CaseStatus; detail?: string } {
  if (ts instanceof Error && py instanceof Error) {
    const [a, b] = [mlxMessage(ts), mlxMessage(py)];
    return a === b ? { status: "unsupported", detail: a } : { status: "fail", detail: `both failed, differently: TS ${ts.message} | Python ${py.message}` };
  }
  const detail = compare(ts, py);
  return detail === undefined ? { status: "exact" } : { status: "fail", detail };
}

function compare(ts: TsOut[] | Error, py: NpyRecord[] | Error): string | undefined {
  if (ts instanceof Error && py instanceof Error) return `both failed: TS ${ts.message} | ${py.message}`;
  if (ts instanceof Error) return `TS failed: ${ts.message}`;
  if (py instanceof Error) return `Python failed: ${py.message}`;
  if (ts.length !== py.length) return `output count TS ${ts.length} vs Python ${py.length}`;
  for (let i = 0; i < ts.length; i++) {
    const t = ts[i]!;
    const p = py[i]!;
    if (t.dtype !== p.dtype) return `output ${i}: dtype TS ${t.dtype} vs Python ${p.dtype}`;
    if (t.shape.join(",") !== p.shape.join(",")) return `output ${i}: shape TS [${t.shape}] vs Python [${p.shape}]`;
    const data = p.data;
    if (data.byteLength !== t.bytes.byteLength) return `output ${i}: ${t.bytes.byteLength} bytes vs Python ${data.byteLength}`;
    if (!Buffer.from(data.buffer, data.byteOffset, data.byteLength).equals(Buffer.from(t.bytes.buffer, t.bytes.byteOffset, t.bytes.byteLength))) {
      let diff = 0;
      let first = -1;
      for (let j = 0; j < data.byteLength; j++) {
        if (data[j] !== t.bytes[j]) {
          diff++;
          if (first < 0) first = j;
        }
      }
      return `output ${i} (${t.dtype}[${t.shape}]): ${diff} of ${data.byteLength} bytes differ (first at byte ${first})`;
    }
  }
  return undefined;
}

export interface RunOptions {
  /** At most this many oracle requests in flight. */
  window?: number;
  /**
   * Stop issuing cases after the first one that is not exact (the in-flight ones finish), so the
   * caller can check that both processes still work before going on (oracle/ops/isolated.ts).
   */
  stopAfterFailure?: boolean;
  onResult?: (r: CaseResult, index: number) => void;
}

/**
 * Runs the cases against the oracle; at most `window` requests in flight. Returns one result per
 * case run, in case order; with stopAfterFailure the list may end early.
 */
export async function runCases(cases: readonly OpCase[], oracle: OracleClient, opts: RunOptions | number = {}): Promise<CaseResult[]> {
  const { window = 32, stopAfterFailure = false, onResult } = typeof opts === "number" ? { window: opts } : opts;
  const results: CaseResult[] = new Array(cases.length);
  const inflight = new Set<Promise<void>>();
  let stop = false;
  let issued = 0;
  const record = (i: number, r: CaseResult) => {
    results[i] = r;
    if (r.status !== "exact" && stopAfterFailure) stop = true;
    onResult?.(r, i);
  };
  try {
    for (let i = 0; i < cases.length && !stop; i++) {
      const c = cases[i]!;
      issued = i + 1;
      let prep: Prepared;
      try {
        prep = prepare(c);
      } catch (e) {
        record(i, { id: c.id, op: c.op, status: "fail", ok: false, detail: `input preparation failed: ${(e as Error).message}` });
        continue;
      }
      const params = prep.views.some((v) => v !== null) ? { ...c.params, _views: prep.views } : c.params;
      const py = oracle.op(c.oracle, prep.oracle, params).catch((e: Error) => e);
      // (the client writes the input .npy files synchronously inside op())
      let ts: TsOut[] | Error;
      try {
        if (prep.ts instanceof Error) throw prep.ts;
        const r = c.run(prep.ts, c.params);
        const outs = Array.isArray(r) ? r : [r];
        mx.evaluate(outs);
        ts = outs.map((o) => ({ dtype: o.dtype, shape: o.shape, bytes: o.toBytes() }));
        for (const o of outs) if (!prep.owned.includes(o)) o.dispose();
      } catch (e) {
        ts = e as Error;
      } finally {
        for (const a of prep.owned) a.dispose();
      }
      if (ts instanceof Error && stopAfterFailure) stop = true;
      const p = py.then((out) => {
        const { status, detail } = classify(ts, out);
        // a byte difference (both sides ran) on a path recorded as MLX's own bug here
        const bug = status === "fail" && !(ts instanceof Error) && !(out instanceof Error) ? mlxBugForOp(c) : null;
        if (bug) record(i, { id: c.id, op: c.op, status: "mlx-bug", ok: false, detail: detail!, mlxBug: bug });
        else record(i, { id: c.id, op: c.op, status, ok: status === "exact", ...(detail ? { detail } : {}) });
      });
      inflight.add(p);
      void p.finally(() => inflight.delete(p));
      if (inflight.size >= window) await Promise.race(inflight);
    }
    await Promise.all(inflight);
  } finally {
    await Promise.allSettled(inflight);
  }
  return results.slice(0, issued);
}

export interface Coverage {
  exposed: string[];
  tested: string[];
  untested: string[];
  cases: number;
  bitExact: number;
  /** Both sides rejected the case with the same MLX error (see CaseStatus). */
  unsupported: CaseResult[];
  /** Byte differences on a path of MLX's own proven broken on this backend (see CaseStatus). */
  mlxBugs: CaseResult[];
  failures: CaseResult[];
}

export function coverage(exposed: string[], cases: readonly OpCase[], results: CaseResult[]): Coverage {
  const tested = new Set(cases.map((c) => c.op));
  return {
    exposed,
    tested: exposed.filter((o) => tested.has(o)),
    untested: exposed.filter((o) => !tested.has(o)),
    cases: results.length,
    bitExact: results.filter((r) => r.status === "exact").length,
    unsupported: results.filter((r) => r.status === "unsupported"),
    mlxBugs: results.filter((r) => r.status === "mlx-bug"),
    failures: results.filter((r) => r.status === "fail"),
  };
}

/** Unsupported cases grouped by their MLX message: [message, case ids]. */
export function groupUnsupported(rs: readonly CaseResult[]): [string, string[]][] {
  const m = new Map<string, string[]>();
  for (const r of rs) m.set(r.detail ?? "", [...(m.get(r.detail ?? "") ?? []), r.id]);
  return [...m].sort((a, b) => b[1].length - a[1].length);
}

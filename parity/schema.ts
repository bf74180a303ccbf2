// The parity report's data model: what parity.json holds (documented in parity/SCHEMA.md).

export const SCHEMA_ID = "gemma4-parity/report@2";

/** How one tap of one step compared. */
export interface TapResult {
  step: number;
  /** The full tap name of the shared scheme (oracle/TAPS.md). */
  name: string;
  /** Decoder layer index, or null for model-level taps (embed, final norm, logits). */
  layer: number | null;
  /** The name without step and layer prefixes, e.g. "self_attn/q_norm". */
  kind: string;
  dtype: string;
  shape: number[];
  size: number;
  /** Elements whose bits differ. */
  mismatches: number;
  maxAbs: number;
  maxUlp: number;
  /** First differing flat index, or -1. */
  firstIndex: number;
}

export interface Divergence {
  step: number;
  tap: string;
  layer: number | null;
  maxAbs: number;
  maxUlp: number;
  mismatches: number;
  firstIndex: number;
  /** Filled by --bisect: the first MLX op inside the block whose output differs. */
  bisect?: {
    /** The MLX primitive, e.g. "Matmul", and its input dtypes and shapes. */
    op: string;
    inputs: { dtype: string; shape: number[] }[];
    maxAbs: number;
    maxUlp: number;
    /** Parameters feeding the block whose bytes differ between the TS and the mlx-lm checkpoint. */
    differingParameters: string[];
    /** Whether replaying the block with mlx-lm's parameters reproduces mlx-lm's tap bit for bit. */
    reproducesOracle: boolean;
  } | null;
}

export interface RunResult {
  /** Fixture id or checkpoint directory. */
  model: string;
  /** e.g. "bfloat16 · flat", "q4-g32 · wrapper". */
  variant: string;
  scenario: string;
  steps: number;
  tapsCompared: number;
  bitExact: number;
  /** Taps within the --ulp/--atol budget (equals bitExact when the budget is 0). */
  withinBudget: number;
  firstDivergence: Divergence | null;
  /**
   * Set when the run's FIRST divergent tap is produced by an op on the path of a recorded MLX bug
   * on this backend (oracle/mlx_bugs.ts mlxBugAtTap, each bug with its Python-only reproducer):
   * counted apart, not as a failure (a failure under --strict), and the taps from that one on are
   * unverified.
   */
  mlxBug?: { id: string; what: string; reproducer: string; tap: string };
  /** With mlxBug: the taps compared from the first divergent one on (bit-exact or not, they are downstream of MLX's bug). */
  unverifiedTaps?: number;
  tokens: { ts: number[]; oracle: number[] };
  taps: TapResult[];
  seconds: number;
}

/** A case of the op table that is not bit-exact (every one is listed). */
export interface NonExactCase {
  id: string;
  op: string;
  status: "unsupported" | "mlx-bug" | "fail";
  detail: string;
  /** It left a sticky error behind; the processes were restarted after it. */
  sticky: boolean;
}

export interface OpLevelSummary {
  opsExposed: number;
  opsTested: number;
  cases: number;
  bitExact: number;
  /** Cases both sides rejected with the same MLX error, on `backend`. */
  unsupported: number;
  /** Byte differences on a path of MLX's own proven broken on `backend` (oracle/mlx_bugs.ts), counted apart. */
  mlxBug: number;
  failed: number;
  /** The MLX backend and device the cases ran on, e.g. "cuda" / "gpu". */
  backend: string;
  device: string;
  /** Worker processes used (more than one after a case poisoned a process). */
  workers: number;
  /** The gradient table: each differentiable op's vjp against Python's mx.vjp. */
  vjp: { opsDifferentiable: number; opsTested: number; cases: number; bitExact: number; unsupported: number; mlxBug: number; failed: number };
  /** Forward and vjp cases ("vjp:" ids) that are not bit-exact. */
  nonExact: NonExactCase[];
}

/** One float32 fixture against the independent reference (transformers; oracle/reference.ts). */
export interface ReferenceRow {
  checkpoint: string;
  /** TS logits equal mlx-lm's byte for byte on the reference's tokens. */
  tsEqualsMlxLm: boolean;
  /** Relative differences (max |a - b| / max |reference|) to transformers' float32 run. */
  tsVsTransformers: { logits: number; hidden: number };
  mlxLmVsTransformers: { logits: number };
  /** Whether the bound judges this device (it was measured on the CPU device: oracle/reference.ts). */
  judged: boolean;
  ok: boolean;
}

export interface ReferenceSummary {
  /** The one recorded bound (oracle/reference.ts REFERENCE_BOUND). */
  bound: number;
  /** torch / transformers versions of the exported reference. */
  versions: Record<string, string>;
  rows: ReferenceRow[];
}

export interface ParityReport {
  schema: typeof SCHEMA_ID;
  createdAt: string;
  versions: Record<string, string>;
  budget: { ulp: number; atol: number };
  opLevel: OpLevelSummary | null;
  runs: RunResult[];
  /** The three-way check on the float32 fixtures (fixture runs only; null with --model). */
  reference?: ReferenceSummary | null;
  /** What the report claims: PASS, PASS with known MLX bugs (and how much is unverified), or FAIL. */
  verdict: Verdict;
  /** The exit status is 0: verdict.status is "pass", or "pass-with-known-mlx-bugs" without --strict. */
  ok: boolean;
}

/**
 * `pass`: everything compared is within budget (op cases bit-exact or unsupported on the
 * backend). `pass-with-known-mlx-bugs`: besides, some runs (or op cases) diverge at a recorded MLX
 * bug, the rest within budget; what comes after those divergences is unverified. `fail`: anything
 * else, or known MLX bugs under --strict.
 */
export interface Verdict {
  status: "pass" | "pass-with-known-mlx-bugs" | "fail";
  /** The verdict line every report format prints, e.g. "PASS with known MLX bugs (1 runs, 12 of 400 taps unverified)". */
  text: string;
  /** Runs attributed to a recorded MLX bug at their first divergent tap. */
  mlxBugRuns: number;
  /** Taps of those runs from their first divergent tap on. */
  unverifiedTaps: number;
  /** Taps compared over all runs. */
  taps: number;
  /** Op-level cases (forward + vjp) counted apart at a recorded MLX bug. */
  mlxBugCases: number;
  /** --strict: known MLX bugs fail the report. */
  strict: boolean;
}

/** Within budget, or attributed to a recorded MLX bug at the first divergent tap (not a failure unless --strict). */
export function runOk(r: RunResult): boolean {
  return r.withinBudget === r.tapsCompared || r.mlxBug !== undefined;
}

export function reportOk(runs: RunResult[], op: OpLevelSummary | null, reference: ReferenceSummary | null = null, strict = false): boolean {
  return reportVerdict(runs, op, reference, strict).status !== "fail";
}

/** The report's verdict (parity/SCHEMA.md): the one place PASS, PASS with known MLX bugs and FAIL are decided. */
export function reportVerdict(runs: RunResult[], op: OpLevelSummary | null, reference: ReferenceSummary | null = null, strict = false): Verdict {
  const opOk =
    op === null ||
    (op.failed === 0 && op.bitExact + op.unsupported + op.mlxBug === op.cases && op.opsTested === op.opsExposed && op.vjp.failed === 0 && op.vjp.bitExact + op.vjp.unsupported + op.vjp.mlxBug === op.vjp.cases && op.vjp.opsTested === op.vjp.opsDifferentiable);
  const allOk = opOk && runs.every(runOk) && (reference === null || reference.rows.every((r) => r.ok));
  const atBugs = runs.filter((r) => r.mlxBug !== undefined);
  const taps = runs.reduce((s, r) => s + r.tapsCompared, 0);
  const unverifiedTaps = atBugs.reduce((s, r) => s + (r.unverifiedTaps ?? r.tapsCompared), 0);
  const mlxBugCases = op ? op.mlxBug + op.vjp.mlxBug : 0;
  const known = atBugs.length > 0 || mlxBugCases > 0;
  const what = `${atBugs.length} runs, ${unverifiedTaps} of ${taps} taps unverified${mlxBugCases ? `, ${mlxBugCases} op cases` : ""}`;
  const base = { mlxBugRuns: atBugs.length, unverifiedTaps, taps, mlxBugCases, strict };
  if (!allOk) return { status: "fail", text: "FAIL", ...base };
  if (!known) return { status: "pass", text: "PASS", ...base };
  if (strict) return { status: "fail", text: `FAIL (--strict: known MLX bugs, ${what})`, ...base };
  return { status: "pass-with-known-mlx-bugs", text: `PASS with known MLX bugs (${what})`, ...base };
}

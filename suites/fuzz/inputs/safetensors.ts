// Malformed .safetensors files: a JSON-serialisable description (so a failing input prints
// readably and replays) and the bytes it stands for. Mutations start from a valid file (a base
// header and data section) and break one or two things: the header length field, the header's
// JSON (types, missing fields, unknown dtypes, overflowing shapes, bad or overlapping offsets),
// the text itself, or the body (truncation).
import { readFileSync } from "node:fs";
import fc from "fast-check";

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

export interface StSpec {
  /** The header: a JSON value, or raw text (not necessarily JSON). */
  header: { json: Json } | { text: string };
  /** Spaces appended to the header (legal padding). */
  pad?: number;
  /** Overrides the 8-byte little-endian header length (a decimal string: it may exceed 2^53). */
  length?: string;
  /** The data section: the data section of a real file, or N pattern bytes. */
  body: { file: string } | { bytes: number };
  /** Keep only this fraction of the finished file. */
  truncate?: number;
}

export interface StBase {
  header: Record<string, Json>;
  body: StSpec["body"];
  bodySize: number;
}

/** The header and data section of a real safetensors file. */
export function baseOfFile(file: string): StBase {
  const b = readFileSync(file);
  const n = Number(b.readBigUInt64LE(0));
  return { header: JSON.parse(b.subarray(8, 8 + n).toString("utf8")) as Record<string, Json>, body: { file }, bodySize: b.length - 8 - n };
}

/** A small valid file: three tensors of three dtypes, back to back, with metadata. */
export const SMALL_BASE: StBase = {
  header: {
    __metadata__: { format: "mlx" },
    a: { dtype: "F32", shape: [2, 3], data_offsets: [0, 24] },
    b: { dtype: "I32", shape: [4], data_offsets: [24, 40] },
    c: { dtype: "BF16", shape: [2, 2], data_offsets: [40, 48] },
  },
  body: { bytes: 48 },
  bodySize: 48,
};

function bodyBytes(body: StSpec["body"]): Buffer {
  if ("file" in body) {
    const b = readFileSync(body.file);
    return b.subarray(8 + Number(b.readBigUInt64LE(0)));
  }
  const out = Buffer.alloc(body.bytes);
  for (let i = 0; i < out.length; i++) out[i] = (i * 37 + 11) & 0x7f; // finite float/bf16 patterns
  return out;
}

export function stBytes(s: StSpec): Buffer {
  const text = "json" in s.header ? JSON.stringify(s.header.json) : s.header.text;
  const header = Buffer.concat([Buffer.from(text, "utf8"), Buffer.alloc(s.pad ?? 0, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(s.length !== undefined ? BigInt.asUintN(64, BigInt(s.length)) : BigInt(header.length));
  const all = Buffer.concat([len, header, bodyBytes(s.body)]);
  return s.truncate === undefined ? all : all.subarray(0, Math.floor(all.length * s.truncate));
}

// ------------------------------------------------------------------ mutations

const DTYPES = ["F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL", "C64", "F8_E4M3", "F8_E8M0"];
const BAD_DTYPES: Json[] = ["F8", "f32", "float32", "I4", "U1", "", "F32 ", "Q4_0", 32, null, true, ["F32"], { dtype: "F32" }];
const HUGE = [2 ** 31 - 1, 2 ** 31, 2 ** 32 + 2, 2 ** 53, 2 ** 63, 1e300];
const weird: fc.Arbitrary<Json> = fc.oneof(
  fc.constantFrom<Json>(null, true, false, "", "x", -1, 0, 1.5, -0.5, 1e308, -1e308, [], {}, [null], ["1"], { a: 1 }),
  fc.integer({ min: -5, max: 5 }),
  fc.constantFrom<Json>(...HUGE),
);
const dim: fc.Arbitrary<Json> = fc.oneof(
  { weight: 4, arbitrary: fc.integer({ min: 0, max: 6 }) },
  { weight: 1, arbitrary: fc.integer({ min: -3, max: -1 }) },
  { weight: 1, arbitrary: fc.constantFrom<Json>(...HUGE, 1.5, "2", null) },
);
const shape: fc.Arbitrary<Json> = fc.oneof(
  fc.array(dim, { maxLength: 5 }),
  fc.constantFrom<Json>([2 ** 20, 2 ** 20, 2 ** 20], [65536, 65536], [2 ** 31 - 1, 2], [-1, -1], [-2, -2, -2, -2]),
  weird,
);
const offset: fc.Arbitrary<number> = fc.oneof(fc.integer({ min: -2, max: 80 }), fc.constantFrom(2 ** 31, 2 ** 32, 2 ** 53, 2 ** 63));

type Header = Record<string, Json>;
type Mutation = (h: Header, keys: string[]) => fc.Arbitrary<{ header: Header }>;

const clone = (h: Header): Header => JSON.parse(JSON.stringify(h)) as Header;
const pickKey = (keys: string[]) => fc.constantFrom(...keys);
const entryField = (field: string, value: fc.Arbitrary<Json | undefined>): Mutation => (h, keys) =>
  fc.tuple(pickKey(keys), value).map(([k, v]) => {
    const out = clone(h);
    const e = { ...(out[k] as Record<string, Json>) };
    if (v === undefined) delete e[field];
    else e[field] = v;
    out[k] = e;
    return { header: out };
  });

const MUTATIONS: Mutation[] = [
  entryField("dtype", fc.oneof(fc.constantFrom<Json>(...DTYPES), fc.constantFrom(...BAD_DTYPES), fc.constant(undefined))),
  entryField("shape", fc.oneof(shape, fc.constant(undefined))),
  entryField("data_offsets", fc.oneof(fc.tuple(offset, offset), fc.array(offset, { maxLength: 3 }), weird, fc.constant(undefined))),
  entryField("extra", weird),
  // an entry that is not an object
  (h, keys) => fc.tuple(pickKey(keys), weird).map(([k, v]) => ({ header: { ...clone(h), [k]: v } })),
  // overlapping: one tensor's range moved onto another's
  (h, keys) =>
    fc.tuple(pickKey(keys), pickKey(keys)).map(([a, b]) => {
      const out = clone(h);
      const ea = out[a] as { data_offsets: Json };
      ea.data_offsets = (out[b] as { data_offsets: Json }).data_offsets;
      return { header: out };
    }),
  // metadata of the wrong shape
  (h) => weird.map((m) => ({ header: { ...clone(h), __metadata__: m } })),
  (h) => fc.dictionary(fc.string({ maxLength: 4 }), weird, { maxKeys: 3 }).map((m) => ({ header: { ...clone(h), __metadata__: m } })),
  // odd keys: empty, long, unicode, NUL
  (h, keys) => fc.tuple(pickKey(keys), fc.constantFrom("", "x".repeat(5000), "κλειδί", "a\u0000b", "__metadata__ ")).map(([k, nk]) => {
    const out = clone(h);
    const v = out[k]!;
    delete out[k];
    out[nk] = v;
    return { header: out };
  }),
];

/** Inputs from one base file: valid controls, header mutations, raw-text and length-field breakage, truncation. */
export function arbSafetensors(base: StBase): fc.Arbitrary<StSpec> {
  const keys = Object.keys(base.header).filter((k) => k !== "__metadata__");
  const json = (h: Json, extra: Partial<StSpec> = {}): StSpec => ({ header: { json: h }, body: base.body, ...extra });
  const one = () => fc.oneof(...MUTATIONS.map((m) => m(base.header, keys)));
  const mutated = one().map((m) => json(m.header));
  const text = JSON.stringify(base.header);
  return fc.oneof(
    { weight: 1, arbitrary: fc.constant(json(base.header)) },
    { weight: 1, arbitrary: fc.integer({ min: 0, max: 64 }).map((pad) => json(base.header, { pad })) },
    { weight: 10, arbitrary: mutated },
    { weight: 2, arbitrary: fc.tuple(one(), one()).map(([a, b]) => json({ ...a.header, ...b.header })) },
    // the header is not an object
    { weight: 2, arbitrary: weird.map((h) => json(h)) },
    // raw text: cut, garbage, non-UTF-8, duplicated keys, BOM
    { weight: 3, arbitrary: fc.integer({ min: 0, max: text.length - 1 }).map((n) => ({ header: { text: text.slice(0, n) }, body: base.body })) },
    { weight: 1, arbitrary: fc.string({ maxLength: 40 }).map((t) => ({ header: { text: t }, body: base.body })) },
    { weight: 1, arbitrary: fc.constantFrom(`\ufeff${text}`, `${text}garbage`, `${text.slice(0, -1)},"a":${JSON.stringify(base.header[keys[0]!])}}`, "\u0000".repeat(16), "\ud800\udfff{}").map((t) => ({ header: { text: t }, body: base.body })) },
    // the length field
    {
      weight: 3,
      arbitrary: fc
        .oneof(fc.constantFrom("0", "1", "7", "100000000", "99999999", "18446744073709551615", "9223372036854775808", "4294967296"), fc.integer({ min: 0, max: text.length + 200 }).map(String))
        .map((length) => json(base.header, { length })),
    },
    // the body
    { weight: 3, arbitrary: fc.double({ min: 0, max: 1, noNaN: true }).map((truncate) => json(base.header, { truncate })) },
    { weight: 1, arbitrary: fc.integer({ min: 0, max: base.bodySize * 2 }).map((bytes) => ({ header: { json: base.header }, body: { bytes } })) },
  );
}

import { describe, expect, it } from "vitest";
import { parse as npyjsParse } from "npyjs";
import { DTYPE_NAMES, type NpyRecord, NpyError, itemSize, parseNpy, toNpy } from "../../oracle/npy.ts";

function record(dtype: NpyRecord["dtype"], shape: number[]): NpyRecord {
  const n = shape.reduce((a, b) => a * b, 1) * itemSize(dtype);
  const data = new Uint8Array(n);
  for (let i = 0; i < n; i++) data[i] = (i * 37 + 11) & 0xff;
  if (dtype === "bool") for (let i = 0; i < n; i++) data[i] = i % 3 === 0 ? 1 : 0;
  return { dtype, shape, data };
}

describe("npy codec", () => {
  it("round-trips raw bytes for every MLX dtype and several shapes", () => {
    for (const dtype of DTYPE_NAMES) {
      for (const shape of [[], [1], [3], [2, 3], [1, 2, 1, 4]]) {
        const rec = record(dtype, shape);
        const bytes = toNpy(rec);
        expect((bytes.length - rec.data.length) % 64).toBe(0); // header padded to 64 bytes
        const back = parseNpy(bytes, dtype === "bfloat16" ? "bfloat16" : undefined);
        expect(back.dtype).toBe(dtype);
        expect(back.shape).toEqual(shape);
        expect(Buffer.compare(Buffer.from(back.data), Buffer.from(rec.data))).toBe(0);
      }
    }
  });

  it("stores bfloat16 as <u2 and needs the tag to read it back as bfloat16", () => {
    const rec = record("bfloat16", [4]);
    const bytes = toNpy(rec);
    expect(new TextDecoder().decode(bytes.subarray(10, 40))).toContain("'<u2'");
    expect(parseNpy(bytes).dtype).toBe("uint16");
    expect(parseNpy(bytes, "bfloat16").dtype).toBe("bfloat16");
    expect(() => parseNpy(toNpy(record("float32", [2])), "bfloat16")).toThrow(/does not match/);
  });

  it("agrees with npyjs on header, shape and data bytes", () => {
    for (const dtype of ["float32", "int32", "uint8", "float64", "int64", "uint16"] as const) {
      const rec = record(dtype, [2, 5]);
      const bytes = toNpy(rec);
      const ref = npyjsParse(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer);
      expect(ref.shape).toEqual([2, 5]);
      const view = ref.data as ArrayBufferView;
      expect(Buffer.compare(Buffer.from(view.buffer, view.byteOffset, view.byteLength), Buffer.from(rec.data))).toBe(0);
    }
  });

  it("rejects bad magic, truncated data and fortran order with clear errors", () => {
    expect(() => parseNpy(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]))).toThrow(NpyError);
    const good = toNpy(record("float32", [8]));
    expect(() => parseNpy(good.subarray(0, good.length - 4))).toThrow(/truncated/);
    const fortran = Buffer.from(good);
    const at = fortran.indexOf("'fortran_order': False");
    fortran.write("'fortran_order': True ", at, "ascii");
    expect(() => parseNpy(new Uint8Array(fortran))).toThrow(/fortran/);
    expect(() => toNpy({ dtype: "float32", shape: [3], data: new Uint8Array(4) })).toThrow(/needs 12/);
  });
});

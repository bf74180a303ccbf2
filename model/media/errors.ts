// One typed error for every bad media input (image or audio file), so that a face can turn it
// into exit code 2 and a test can check which problem was named.

export type MediaProblem =
  | "unreadable" // the file cannot be read (missing, a directory, permissions)
  | "unsupported_format" // not a PNG, JPEG or WAV file, or an encoding of one that is not supported
  | "corrupt" // a malformed header, a bad checksum, undecodable data
  | "truncated" // the data ends before the image or the audio does
  | "too_large" // more pixels than the configured limit
  | "sample_rate" // audio at another rate than the feature extractor's
  | "empty"; // audio with no samples

/** A problem with one media file, naming the file and what is wrong with it. */
export class MediaError extends Error {
  override readonly name = "MediaError";
  constructor(
    readonly file: string,
    readonly problem: MediaProblem,
    readonly detail: string,
  ) {
    super(`${file}: ${detail}`);
  }
}

/**
 * Pure text formatting for the sidebar: percentages, ages, ready counts, the connect
 * snippet and readable error sentences. No DOM and no JupyterLab imports, so jest tests
 * it directly.
 */

/** Shown where a number is unknown (a node that did not answer, a GPU without NVML). */
export const UNKNOWN = '–';

function isNumber(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

/** `12.4` -> `12%`; unknown -> `–`. */
export function formatPercent(value: number | null | undefined): string {
  return isNumber(value) ? `${Math.round(value)}%` : UNKNOWN;
}

/** A cluster's age in seconds as people say it: `8 s`, `5 min`, `2 h 05 min`, `3 d 4 h`. */
export function formatAge(seconds: number | null | undefined): string {
  if (!isNumber(seconds) || seconds < 0) {
    return UNKNOWN;
  }
  const s = Math.floor(seconds);
  if (s < 60) {
    return `${s} s`;
  }
  const minutes = Math.floor(s / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const hours = Math.floor(minutes / 60);
  if (hours < 24) {
    return `${hours} h ${String(minutes % 60).padStart(2, '0')} min`;
  }
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** `ready/target`, e.g. `3/4`; a missing count reads as 0. */
export function formatReady(
  ready: number | null | undefined,
  target: number | null | undefined
): string {
  const r = isNumber(ready) ? Math.max(0, Math.round(ready)) : 0;
  const t = isNumber(target) ? Math.max(0, Math.round(target)) : 0;
  return `${r}/${t}`;
}

/** A run's progress as `done/total`, e.g. `37/200`; a missing count reads as 0. */
export function formatProgress(
  done: number | null | undefined,
  total: number | null | undefined
): string {
  return formatReady(done, total);
}

/** How full a run's progress bar is, 0 to 100; an empty run (no items) is full. */
export function progressPercent(
  done: number | null | undefined,
  total: number | null | undefined
): number {
  const d = isNumber(done) ? Math.max(0, done) : 0;
  if (!isNumber(total) || total <= 0) {
    return 100;
  }
  return Math.min(100, Math.round((100 * d) / total));
}

/** `1 error`, `3 errors`; none: empty (a clean run says nothing about errors). */
export function formatErrors(count: number | null | undefined): string {
  const n = isNumber(count) ? Math.max(0, Math.round(count)) : 0;
  if (n === 0) {
    return '';
  }
  return n === 1 ? '1 error' : `${n} errors`;
}

/** One GPU: `3% (mem 10%)`; several joined with commas; none: `no GPU`. */
export function formatGpus(
  gpus: ReadonlyArray<{
    util_percent?: number | null;
    mem_percent?: number | null;
  }>
): string {
  if (gpus.length === 0) {
    return 'no GPU';
  }
  return gpus
    .map(
      gpu =>
        `${formatPercent(gpu.util_percent)} (mem ${formatPercent(gpu.mem_percent)})`
    )
    .join(', ');
}

/** `1 engine`, `4 engines`. */
export function formatEngines(count: number | null | undefined): string {
  const n = isNumber(count) ? Math.max(0, Math.round(count)) : 0;
  return n === 1 ? '1 engine' : `${n} engines`;
}

/** `gpu, nlp`; none: `–`. */
export function formatPools(pools: ReadonlyArray<string>): string {
  return pools.length ? pools.join(', ') : UNKNOWN;
}

/**
 * The Python that attaches to a cluster, for a notebook cell. The server sends it as
 * `connect_code`; when it does not (an older server), the same code is written here.
 */
export function connectSnippet(cluster: {
  name: string;
  connect_code?: string | null;
}): string {
  if (typeof cluster.connect_code === 'string' && cluster.connect_code.trim()) {
    return cluster.connect_code;
  }
  return [
    'from jupyter_lounge import Lounge',
    `lounge = Lounge.attach(${JSON.stringify(cluster.name)})`,
    'client = lounge.client'
  ].join('\n');
}

/** The first sentence-worth of a text, without HTML; long bodies are cut. */
function plainText(body: string): string {
  const text = body.trim();
  if (!text || /^\s*</.test(text)) {
    return '';
  }
  return text.length > 300 ? `${text.slice(0, 297)}...` : text;
}

/**
 * What a failed request says to a person. The lounge server answers every error with
 * `{"message": "<one sentence>"}`; that sentence is shown as it is. Anything else (an
 * HTML error page of a server without the lounge extension, a proxy) gets a sentence
 * made from the status.
 */
export function readableError(
  status: number,
  statusText: string,
  body: string
): string {
  try {
    const parsed: unknown = JSON.parse(body);
    if (parsed && typeof parsed === 'object') {
      const message = (parsed as { message?: unknown }).message;
      if (typeof message === 'string' && message.trim()) {
        return message.trim();
      }
      const reason = (parsed as { reason?: unknown }).reason;
      if (typeof reason === 'string' && reason.trim()) {
        return reason.trim();
      }
    }
  } catch {
    // not JSON: fall through
  }
  const code = statusText ? `${status} ${statusText}` : `${status}`;
  if (status === 403) {
    return `The Jupyter server refused the request (${code}): reload the page to log in again.`;
  }
  if (status === 404) {
    return `The Jupyter server has no lounge API here (${code}): is the jupyter_lounge server extension enabled (jupyter server extension list)?`;
  }
  const text = plainText(body);
  if (text) {
    return `The Jupyter server answered ${code}: ${text}`;
  }
  return `The Jupyter server answered ${code}.`;
}

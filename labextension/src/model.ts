/**
 * The JSON shapes of the lounge REST API (docs/rest-api.md) in one place, and the pure
 * logic on them: reading answers defensively, what each row of the sidebar says, and
 * the request bodies the dialogs send. No DOM and no JupyterLab imports.
 */

import {
  formatAge,
  formatEngines,
  formatErrors,
  formatGpus,
  formatPercent,
  formatPools,
  formatProgress,
  formatReady,
  progressPercent
} from './format';

/** A run (a `lounge.map`) of a cluster: `GET /jupyter-lounge/clusters/{name}/runs` entries,
 * and each cluster's `runs`. */
export interface IRunModel {
  name: string;
  cluster: string;
  /** `submitted`, `running`, `done`, `cancelled`, `failed` or `stalled`. */
  status: string;
  /** Why it failed or stalled, or null. */
  error: string | null;
  done: number;
  total: number;
  /** Items whose call raised (their rows hold the error). */
  errors: number;
  /** Seconds since the epoch. */
  started: number | null;
  finished: number | null;
  pool: string | null;
  /** The Python that loads the run's DataFrame in a notebook. */
  load_code: string;
}

/** `GET /jupyter-lounge/clusters` entries. */
export interface IClusterModel {
  name: string;
  /** Engine kind: `ipyparallel` or `dask`. */
  engines: string;
  backend: string;
  /** `starting`, `running`, `stopping`, `dead`, `failed` or `corrupt` (unreadable state). */
  status: string;
  n: number;
  ready: number;
  target: number;
  nodes: number;
  age_s: number | null;
  preload: string | null;
  /** Slurm's pending reason, or null. */
  pending: string | null;
  /** Why a start from the sidebar failed, or null. */
  error: string | null;
  connect_code: string;
  /** Its runs, oldest first. */
  runs: IRunModel[];
}

export interface IGpuModel {
  util_percent: number | null;
  mem_percent: number | null;
}

/** `GET /jupyter-lounge/nodes` entries. */
export interface INodeModel {
  name: string;
  host: string;
  backend: string;
  /** `idle`, `in use` or `offline`. */
  state: string;
  why: string;
  cpu: number | null;
  mem: number | null;
  gpus: IGpuModel[];
  users: string[];
  engines: number;
  pools: string[];
}

export interface IBackendModel {
  name: string;
  available: boolean;
  why: string;
  options: string[];
  pools: string[];
}

/** One effective default of a start: its value and where it came from (`built-in`, or a
 * file and line such as `/etc/lounge.toml line 12 ([start])`). */
export interface IStartDefault {
  value: unknown;
  source: string;
}

/** `GET /jupyter-lounge/backends`. */
export interface IBackendsModel {
  engines: string[];
  backends: IBackendModel[];
  /** The effective default of each start option (`backend`, `engines`, `pool`, `preload`,
   * `n`, `timeout`, ...); empty from a server that does not send them. */
  defaults: Record<string, IStartDefault>;
  /** Why the configured defaults could not be read (a config file's or the inventory's
   * mistake: `defaults` then holds the built-in ones and a start is refused), or ''. */
  defaultsError: string;
}

/** What the start dialog's fields hold, as typed. */
export interface IStartForm {
  n: string;
  backend: string;
  engines: string;
  pool: string;
  preload: string;
  name: string;
}

/** `POST /jupyter-lounge/clusters` body. */
export interface IStartRequest {
  n?: number | string;
  backend: string;
  engines: string;
  pool: string | null;
  preload: string | null;
  name: string | null;
}

/** `PATCH /jupyter-lounge/clusters/{name}` body. */
export interface IScaleRequest {
  n?: number | string;
}

/** Used until `GET backends` answers (or when it cannot). */
export const DEFAULT_BACKENDS: IBackendsModel = {
  engines: ['ipyparallel', 'dask'],
  backends: [
    { name: 'local', available: true, why: '', options: [], pools: [] }
  ],
  defaults: {},
  defaultsError: ''
};

// ---------------------------------------------------------------------------
// Reading answers: a field the server leaves out or sends as the wrong type gets a
// harmless default rather than breaking the whole sidebar.

type Json = Record<string, unknown>;

function asObject(value: unknown): Json {
  return value && typeof value === 'object' && !Array.isArray(value)
    ? (value as Json)
    : {};
}

function asString(value: unknown, fallback = ''): string {
  return typeof value === 'string' ? value : fallback;
}

function asNullableString(value: unknown): string | null {
  return typeof value === 'string' && value !== '' ? value : null;
}

function asNumber(value: unknown, fallback = 0): number {
  return typeof value === 'number' && Number.isFinite(value) ? value : fallback;
}

function asNullableNumber(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

function asStrings(value: unknown): string[] {
  return Array.isArray(value)
    ? value.filter((v): v is string => typeof v === 'string')
    : [];
}

function asList(body: unknown, key: string): unknown[] {
  const list = asObject(body)[key];
  return Array.isArray(list) ? list : [];
}

export function parseRun(raw: unknown): IRunModel {
  const r = asObject(raw);
  return {
    name: asString(r.name),
    cluster: asString(r.cluster),
    status: asString(r.status, 'unknown'),
    error: asNullableString(r.error),
    done: asNumber(r.done),
    total: asNumber(r.total),
    errors: asNumber(r.errors),
    started: asNullableNumber(r.started),
    finished: asNullableNumber(r.finished),
    pool: asNullableString(r.pool),
    load_code: asString(r.load_code)
  };
}

/** A list of runs as the server sent it (oldest first), nameless entries dropped. */
export function parseRuns(list: unknown): IRunModel[] {
  return (Array.isArray(list) ? list : []).map(parseRun).filter(r => r.name !== '');
}

export function parseCluster(raw: unknown): IClusterModel {
  const c = asObject(raw);
  const n = asNumber(c.n);
  let preload: string | null;
  if (Array.isArray(c.preload)) {
    preload = asStrings(c.preload).join(',') || null;
  } else {
    preload = asNullableString(c.preload);
  }
  return {
    name: asString(c.name),
    engines: asString(c.engines),
    backend: asString(c.backend),
    status: asString(c.status, 'unknown'),
    n,
    ready: asNumber(c.ready),
    target: asNumber(c.target, n),
    nodes: asNumber(c.nodes),
    age_s: asNullableNumber(c.age_s),
    preload,
    pending: asNullableString(c.pending),
    error: asNullableString(c.error),
    connect_code: asString(c.connect_code),
    runs: parseRuns(c.runs)
  };
}

/** The clusters of `GET clusters`, in name order, nameless entries dropped. */
export function parseClusters(body: unknown): IClusterModel[] {
  return asList(body, 'clusters')
    .map(parseCluster)
    .filter(c => c.name !== '')
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

export function parseNode(raw: unknown): INodeModel {
  const n = asObject(raw);
  const gpus = Array.isArray(n.gpus) ? n.gpus : [];
  return {
    name: asString(n.name),
    host: asString(n.host),
    backend: asString(n.backend),
    state: asString(n.state, 'offline'),
    why: asString(n.why),
    cpu: asNullableNumber(n.cpu),
    mem: asNullableNumber(n.mem),
    gpus: gpus.map(g => {
      const gpu = asObject(g);
      return {
        util_percent: asNullableNumber(gpu.util_percent),
        mem_percent: asNullableNumber(gpu.mem_percent)
      };
    }),
    users: asStrings(n.users),
    engines: asNumber(n.engines),
    pools: asStrings(n.pools)
  };
}

/** The nodes of `GET nodes`, in the server's order (this machine first). */
export function parseNodes(body: unknown): INodeModel[] {
  return asList(body, 'nodes')
    .map(parseNode)
    .filter(n => n.name !== '');
}

/** The `defaults` object of `GET backends`: entries that are not `{value, source}`
 * objects are dropped (a missing source reads as `built-in`). */
export function parseDefaults(raw: unknown): Record<string, IStartDefault> {
  const defaults: Record<string, IStartDefault> = {};
  for (const [key, entry] of Object.entries(asObject(raw))) {
    const d = asObject(entry);
    if (!('value' in d)) {
      continue;
    }
    defaults[key] = { value: d.value, source: asString(d.source).trim() || 'built-in' };
  }
  return defaults;
}

export function parseBackends(body: unknown): IBackendsModel {
  const engines = asStrings(asObject(body).engines);
  const backends = asList(body, 'backends')
    .map(raw => {
      const b = asObject(raw);
      return {
        name: asString(b.name),
        available: b.available !== false,
        why: asString(b.why),
        options: asStrings(b.options),
        pools: asStrings(b.pools)
      };
    })
    .filter(b => b.name !== '');
  return {
    engines: engines.length ? engines : DEFAULT_BACKENDS.engines,
    backends: backends.length ? backends : DEFAULT_BACKENDS.backends,
    defaults: parseDefaults(asObject(body).defaults),
    defaultsError: asString(asObject(body).defaults_error).trim()
  };
}

// ---------------------------------------------------------------------------
// What the rows say.

/** How a status looks: drives the colour of the status text. */
export type Tone = 'ok' | 'busy' | 'warn' | 'error';

/** An action on a cluster (or on a run: `cancelling`) still waiting for the server's
 * answer. */
export type Busy = 'stopping' | 'scaling' | 'interrupting' | 'cancelling';

export interface IClusterView {
  name: string;
  /** `ipyparallel · local · 2 nodes · tensorflow`. */
  summary: string;
  ready: string;
  /** The status, or Slurm's pending reason while it waits in the queue. */
  status: string;
  tone: Tone;
  /** Why a start failed, or why the state cannot be read, shown under the row. */
  detail: string;
  age: string;
  canScale: boolean;
  /** Interrupt the running work on every engine (the cluster keeps running). */
  canInterrupt: boolean;
  canStop: boolean;
  canInsert: boolean;
  /** `Stop`; `Remove` for a failed start (nothing is left to stop); `Forget` for a
   * cluster whose state file cannot be read. */
  stopLabel: string;
}

/** The status text: the status itself, or Slurm's reason while a start is pending. */
export function clusterStatusText(cluster: IClusterModel, busy?: Busy): string {
  if (busy === 'stopping' || busy === 'interrupting') {
    return busy;
  }
  if (cluster.pending && cluster.status !== 'running') {
    return /^pending\b/i.test(cluster.pending)
      ? cluster.pending
      : `pending: ${cluster.pending}`;
  }
  return cluster.status;
}

export function describeCluster(
  cluster: IClusterModel,
  busy?: Busy
): IClusterView {
  const status = clusterStatusText(cluster, busy);
  let tone: Tone;
  if (busy || cluster.status === 'starting' || cluster.status === 'stopping') {
    tone = 'busy';
  } else if (cluster.status === 'running') {
    tone = cluster.ready < cluster.target ? 'busy' : 'ok';
  } else if (
    cluster.status === 'failed' ||
    cluster.status === 'dead' ||
    cluster.status === 'corrupt'
  ) {
    tone = 'error';
  } else {
    tone = 'warn';
  }
  if (cluster.pending && !busy && cluster.status !== 'running') {
    tone = 'warn';
  }
  const parts = [cluster.engines, cluster.backend];
  if (cluster.nodes > 1) {
    parts.push(`${cluster.nodes} nodes`);
  }
  if (cluster.preload) {
    parts.push(cluster.preload);
  }
  const live = cluster.status === 'running' || cluster.status === 'starting';
  const failed = cluster.status === 'failed';
  const corrupt = cluster.status === 'corrupt';
  return {
    name: cluster.name,
    summary: parts.filter(Boolean).join(' · '),
    ready: formatReady(cluster.ready, cluster.target),
    status,
    tone,
    detail: (failed || corrupt) && cluster.error ? cluster.error : '',
    age: formatAge(cluster.age_s),
    canScale: live && !busy,
    canInterrupt: cluster.status === 'running' && !busy,
    canStop: busy === undefined && cluster.status !== 'stopping',
    canInsert: live && busy !== 'stopping',
    stopLabel: failed ? 'Remove' : corrupt ? 'Forget' : 'Stop'
  };
}

/** Runs that are still under way: a stalled one resumes once its driver is back. */
const RUN_ACTIVE = ['submitted', 'running', 'stalled'];

export interface IRunView {
  name: string;
  cluster: string;
  /** `done/total`, e.g. `37/200`. */
  progress: string;
  /** How full its bar is, 0 to 100. */
  percent: number;
  /** `3 errors`, or empty. */
  errors: string;
  status: string;
  tone: Tone;
  /** Why it failed or stalled, shown under it. */
  detail: string;
  /** Offered while it is under way; false while a cancel is in flight. */
  canCancel: boolean;
  showCancel: boolean;
  canInsert: boolean;
}

export function describeRun(run: IRunModel, busy?: Busy): IRunView {
  const active = RUN_ACTIVE.includes(run.status);
  let tone: Tone;
  if (busy || run.status === 'running' || run.status === 'submitted') {
    tone = 'busy';
  } else if (run.status === 'done') {
    tone = run.errors ? 'warn' : 'ok';
  } else if (run.status === 'failed') {
    tone = 'error';
  } else {
    tone = 'warn'; // cancelled, stalled
  }
  return {
    name: run.name,
    cluster: run.cluster,
    progress: formatProgress(run.done, run.total),
    percent: progressPercent(run.done, run.total),
    errors: formatErrors(run.errors),
    status: busy === 'cancelling' && active ? busy : run.status,
    tone,
    detail: run.error ?? '',
    canCancel: active && !busy,
    showCancel: active,
    canInsert: run.load_code !== ''
  };
}

/** The key of a run's pending action: never a cluster's name, which has no `/`. */
export function runKey(cluster: string, run: string): string {
  return `${cluster}/${run}`;
}

export interface INodeView {
  name: string;
  /** The host when it says more than the name; empty otherwise. */
  host: string;
  /** `idle`, `in use (ana logged in)`, `offline (no route to host)`. */
  state: string;
  /** A CSS-friendly state: `idle`, `in-use`, `offline`. */
  stateKey: string;
  cpu: string;
  mem: string;
  gpu: string;
  engines: string;
  pools: string;
  users: string;
}

export function nodeStateText(node: INodeModel): string {
  const why = node.why.trim();
  return why ? `${node.state} (${why})` : node.state;
}

export function describeNode(node: INodeModel): INodeView {
  return {
    name: node.name,
    host: node.host && node.host !== node.name ? node.host : '',
    state: nodeStateText(node),
    stateKey: node.state.trim().toLowerCase().replace(/\s+/g, '-') || 'unknown',
    cpu: formatPercent(node.cpu),
    mem: formatPercent(node.mem),
    gpu: formatGpus(node.gpus),
    engines: formatEngines(node.engines),
    pools: formatPools(node.pools),
    users: node.users.join(', ')
  };
}

// ---------------------------------------------------------------------------
// What the dialogs send. The server checks the values and answers a bad one with the
// same sentence the %lounge magic gives, so a value is only converted here, never
// refused: `4` becomes a number, anything else goes as typed for the server to name.

function blankToNull(text: string): string | null {
  const t = text.trim();
  return t === '' ? null : t;
}

/** `" 4 "` -> 4; `"four"` -> `"four"`; `""` -> undefined (left out of the body). */
export function parseCount(text: string): number | string | undefined {
  const t = text.trim();
  if (t === '') {
    return undefined;
  }
  return /^[+-]?\d+(\.\d+)?$/.test(t) ? Number(t) : t;
}

/** `"tensorflow, numpy"` -> `"tensorflow,numpy"`; blank -> null. */
export function normalizePreload(text: string): string | null {
  const modules = text
    .split(/[\s,]+/)
    .map(m => m.trim())
    .filter(Boolean);
  return modules.length ? modules.join(',') : null;
}

export function buildStartRequest(form: IStartForm): IStartRequest {
  const request: IStartRequest = {
    backend: form.backend.trim() || 'local',
    engines: form.engines.trim() || 'ipyparallel',
    pool: blankToNull(form.pool),
    preload: normalizePreload(form.preload),
    name: blankToNull(form.name)
  };
  const n = parseCount(form.n);
  return n === undefined ? request : { n, ...request };
}

export function buildScaleRequest(text: string): IScaleRequest {
  const n = parseCount(text);
  return n === undefined ? {} : { n };
}

/** An entry of the backend select. */
export interface IChoice {
  value: string;
  label: string;
  title: string;
}

/**
 * The backends to offer: every one, an unavailable one saying why in its label (it
 * stays selectable so that starting on it gives the server's full sentence).
 */
export function backendChoices(backends: IBackendsModel): IChoice[] {
  return backends.backends.map(b => ({
    value: b.name,
    label: b.available
      ? b.name
      : `${b.name} (unavailable${b.why ? `: ${b.why}` : ''})`,
    title: b.available ? '' : b.why
  }));
}

/** A default's value as the text of a form field: a list as `a,b`, null as blank. */
export function defaultText(value: unknown): string {
  if (value === null || value === undefined) {
    return '';
  }
  if (Array.isArray(value)) {
    return value
      .filter(v => v !== null && v !== undefined)
      .map(v => String(v).trim())
      .filter(Boolean)
      .join(',');
  }
  if (typeof value === 'string') {
    return value.trim();
  }
  if (typeof value === 'number' || typeof value === 'boolean') {
    return String(value);
  }
  return '';
}

/** The text of one default, or '' when the server sent none. */
function configured(backends: IBackendsModel, key: string): string {
  const entry = backends.defaults[key];
  return entry ? defaultText(entry.value) : '';
}

/**
 * The backend selected at first: the configured default when the server names one it
 * lists, else the first available one.
 */
export function defaultBackend(backends: IBackendsModel): string {
  const wanted = configured(backends, 'backend');
  if (wanted && backends.backends.some(b => b.name === wanted)) {
    return wanted;
  }
  const first = backends.backends.find(b => b.available) ?? backends.backends[0];
  return first ? first.name : 'local';
}

/** The engine kind selected at first: the configured default when it is one the server
 * lists, else the first listed. */
export function defaultEngines(backends: IBackendsModel): string {
  const wanted = configured(backends, 'engines');
  if (wanted && backends.engines.includes(wanted)) {
    return wanted;
  }
  return backends.engines[0] ?? 'ipyparallel';
}

/** Whether a backend takes a pool (the ssh backend; a pool on another is refused). */
export function takesPool(backends: IBackendsModel, backend: string): boolean {
  const found = backends.backends.find(b => b.name === backend);
  return !!found && (found.options.includes('pool') || found.pools.length > 0);
}

/** The pool field's text for a backend: the configured default pool where that backend
 * takes a pool, else blank (any node). */
export function defaultPool(backends: IBackendsModel, backend: string): string {
  return takesPool(backends, backend) ? configured(backends, 'pool') : '';
}

/** The preload field's first text: `["tensorflow", "numpy"]` -> `tensorflow,numpy`. */
export function defaultPreload(backends: IBackendsModel): string {
  return normalizePreload(configured(backends, 'preload')) ?? '';
}

/** The engine count field's first text: the configured `n`, else 4. */
export function defaultCount(backends: IBackendsModel): string {
  return configured(backends, 'n') || '4';
}

/** Pools to suggest for a backend (the ssh backend lists the inventory's). */
export function poolsFor(backends: IBackendsModel, backend: string): string[] {
  const found = backends.backends.find(b => b.name === backend);
  return found ? found.pools : [];
}

/** The last part of a path: `/etc/lounge.toml` -> `lounge.toml`. */
function baseName(path: string): string {
  const parts = path.split(/[\\/]/);
  return parts[parts.length - 1] || path;
}

/**
 * A source with its file shortened to the base name:
 * `/home/u/.ipython/profile_default/ipython_config.py line 3` -> `ipython_config.py line 3`,
 * `/etc/lounge.toml line 12 ([start])` -> `lounge.toml line 12 ([start])`. The text before
 * ` line N` is taken whole as the file when it starts as a path does (a folder's name may
 * hold spaces); otherwise each word that looks like a path is shortened.
 */
export function shortSource(source: string): string {
  const s = source.trim();
  const line = /^(.*?)(\s+line\s+\d+.*)$/s.exec(s);
  if (line && /^(?:[A-Za-z]:|~|\.{1,2})?[\\/]/.test(line[1])) {
    return baseName(line[1]) + line[2];
  }
  return s.replace(/(?:[A-Za-z]:|~|\.{1,2})?(?:[\\/][^\\/\s()[\]'"]+)+/g, path =>
    baseName(path)
  );
}

/** The "where from" line of the start dialog. */
export interface IDefaultsNote {
  /** `Defaults: backend, preload from ipython_config.py line 3; pool from lounge.toml
   * line 13 ([start])`, or '' when every default is built in. */
  text: string;
  /** The same with each source in full (the line's tooltip). */
  title: string;
}

/**
 * Which defaults are configured, and where: grouped by source in the order the server
 * lists them, the built-in ones left out.
 */
export function describeDefaults(backends: IBackendsModel): IDefaultsNote {
  const groups = new Map<string, string[]>();
  for (const [key, entry] of Object.entries(backends.defaults)) {
    const source = entry.source.trim();
    if (!source || source === 'built-in') {
      continue;
    }
    const keys = groups.get(source);
    if (keys) {
      keys.push(key);
    } else {
      groups.set(source, [key]);
    }
  }
  if (groups.size === 0) {
    return { text: '', title: '' };
  }
  const parts = [...groups].map(([source, keys]) => [keys.join(', '), source]);
  return {
    text:
      'Defaults: ' +
      parts.map(([keys, source]) => `${keys} from ${shortSource(source)}`).join('; '),
    title: parts.map(([keys, source]) => `${keys} from ${source}`).join('\n')
  };
}

// ---------------------------------------------------------------------------
// The sidebar's state between refreshes.

export type ErrorSource = 'refresh' | 'action';

/**
 * Nodes, clusters and the latest error. A refresh error goes away with the next good
 * refresh; an action's error (the server refusing a start, say) stays until the next
 * action or until dismissed, so that it can be read.
 */
export class LoungeState {
  clusters: IClusterModel[] = [];
  nodes: INodeModel[] = [];
  backends: IBackendsModel = DEFAULT_BACKENDS;
  /** True once a refresh has answered. */
  loaded = false;
  private _error = '';
  private _errorSource: ErrorSource | null = null;
  private _busy = new Map<string, Busy>();

  get error(): string {
    return this._error;
  }

  get errorSource(): ErrorSource | null {
    return this._errorSource;
  }

  setClusters(clusters: IClusterModel[]): void {
    this.clusters = clusters;
    this.loaded = true;
  }

  setNodes(nodes: INodeModel[]): void {
    this.nodes = nodes;
  }

  /** A refresh succeeded: its own earlier error is over. */
  refreshed(): void {
    if (this._errorSource === 'refresh') {
      this.clearError();
    }
  }

  setError(message: string, source: ErrorSource): void {
    // A refresh error does not hide an action's error the person has not read yet.
    if (source === 'refresh' && this._errorSource === 'action') {
      return;
    }
    this._error = message;
    this._errorSource = source;
  }

  clearError(): void {
    this._error = '';
    this._errorSource = null;
  }

  /** What is in flight for a cluster (its name) or a run (its `runKey`). */
  busy(name: string): Busy | undefined {
    return this._busy.get(name);
  }

  setBusy(name: string, what: Busy | undefined): void {
    if (what) {
      this._busy.set(name, what);
    } else {
      this._busy.delete(name);
    }
  }

  clusterViews(): IClusterView[] {
    return this.clusters.map(c => describeCluster(c, this._busy.get(c.name)));
  }

  runViews(cluster: string): IRunView[] {
    return (this.cluster(cluster)?.runs ?? []).map(r =>
      describeRun(r, this._busy.get(runKey(cluster, r.name)))
    );
  }

  run(cluster: string, name: string): IRunModel | undefined {
    return this.cluster(cluster)?.runs.find(r => r.name === name);
  }

  nodeViews(): INodeView[] {
    return this.nodes.map(describeNode);
  }

  cluster(name: string): IClusterModel | undefined {
    return this.clusters.find(c => c.name === name);
  }
}

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

/** `GET /jupyter-lounge/backends`. */
export interface IBackendsModel {
  engines: string[];
  backends: IBackendModel[];
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
  ]
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
    backends: backends.length ? backends : DEFAULT_BACKENDS.backends
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

/** The backend selected at first: the first available one. */
export function defaultBackend(backends: IBackendsModel): string {
  const first = backends.backends.find(b => b.available) ?? backends.backends[0];
  return first ? first.name : 'local';
}

/** Pools to suggest for a backend (the ssh backend lists the inventory's). */
export function poolsFor(backends: IBackendsModel, backend: string): string[] {
  const found = backends.backends.find(b => b.name === backend);
  return found ? found.pools : [];
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

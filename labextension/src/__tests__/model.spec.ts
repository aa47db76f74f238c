import {
  backendChoices,
  buildScaleRequest,
  buildStartRequest,
  clusterStatusText,
  DEFAULT_BACKENDS,
  defaultBackend,
  defaultCount,
  defaultEngines,
  defaultPool,
  defaultPreload,
  defaultText,
  describeCluster,
  describeDefaults,
  describeNode,
  describeRun,
  IClusterModel,
  INodeModel,
  IRunModel,
  IStartForm,
  LoungeState,
  normalizePreload,
  parseBackends,
  parseClusters,
  parseCount,
  parseNodes,
  parseRuns,
  poolsFor,
  runKey,
  shortSource,
  takesPool
} from '../model';

/** The example answers of docs/rest-api.md. */
const sweep = {
  name: 'sweep-1',
  cluster: 'lounge-1',
  status: 'running',
  error: null,
  done: 37,
  total: 200,
  errors: 2,
  started: 1764780000.5,
  finished: null,
  pool: null,
  load_code:
    "from jupyter_lounge import run\ndf = run('sweep-1', cluster='lounge-1').result()"
};

const clustersAnswer = {
  clusters: [
    {
      name: 'lounge-2',
      engines: 'dask',
      backend: 'slurm',
      status: 'starting',
      n: 24,
      ready: 0,
      target: 24,
      nodes: 3,
      age_s: 4,
      preload: null,
      pending: 'Resources',
      error: null,
      connect_code: 'x',
      runs: []
    },
    {
      name: 'lounge-1',
      engines: 'ipyparallel',
      backend: 'local',
      status: 'running',
      n: 4,
      ready: 4,
      target: 4,
      nodes: 1,
      age_s: 12.5,
      preload: 'tensorflow',
      pending: null,
      error: null,
      connect_code:
        'from jupyter_lounge import Lounge\nlounge = Lounge.attach("lounge-1")\nclient = lounge.client',
      runs: [sweep]
    }
  ]
};

const nodesAnswer = {
  nodes: [
    {
      name: 'this machine',
      host: 'localhost',
      backend: 'local',
      state: 'idle',
      why: '',
      cpu: 12.0,
      mem: 40.1,
      gpus: [{ util_percent: 3, mem_percent: 10 }],
      users: [],
      engines: 4,
      pools: ['local']
    },
    {
      name: 'pc01',
      host: '10.0.0.11',
      backend: 'ssh',
      state: 'in use',
      why: 'ana logged in',
      cpu: 85,
      mem: 60,
      gpus: [],
      users: ['ana'],
      engines: 0,
      pools: ['gpu', 'nlp']
    }
  ]
};

const backendsAnswer = {
  engines: ['ipyparallel', 'dask'],
  backends: [
    { name: 'local', available: true, why: '', options: [] },
    {
      name: 'slurm',
      available: false,
      why: 'sinfo was not found',
      options: ['partition', 'account']
    },
    { name: 'ssh', available: true, why: '', options: ['pool'], pools: ['gpu'] }
  ]
};

function cluster(overrides: Partial<IClusterModel> = {}): IClusterModel {
  return { ...parseClusters(clustersAnswer)[0], ...overrides };
}

function node(overrides: Partial<INodeModel> = {}): INodeModel {
  return { ...parseNodes(nodesAnswer)[0], ...overrides };
}

describe('parseClusters', () => {
  it('reads the documented answer, in name order', () => {
    const clusters = parseClusters(clustersAnswer);
    expect(clusters.map(c => c.name)).toEqual(['lounge-1', 'lounge-2']);
    expect(clusters[0]).toEqual(clustersAnswer.clusters[1]);
  });

  it('gives missing or mistyped fields harmless defaults', () => {
    const [c] = parseClusters({
      clusters: [{ name: 'x', n: 3, ready: '2', preload: ['tensorflow', 'numpy'] }, { n: 1 }]
    });
    expect(c).toEqual({
      name: 'x',
      engines: '',
      backend: '',
      status: 'unknown',
      n: 3,
      ready: 0,
      target: 3,
      nodes: 0,
      age_s: null,
      preload: 'tensorflow,numpy',
      pending: null,
      error: null,
      connect_code: '',
      runs: []
    });
  });

  it('reads anything else as no cluster', () => {
    expect(parseClusters(null)).toEqual([]);
    expect(parseClusters({ clusters: 'no' })).toEqual([]);
    expect(parseClusters([1, 2])).toEqual([]);
  });
});

describe('parseNodes and parseBackends', () => {
  it("keeps the server's node order", () => {
    const nodes = parseNodes(nodesAnswer);
    expect(nodes.map(n => n.name)).toEqual(['this machine', 'pc01']);
    expect(nodes[0].gpus).toEqual([{ util_percent: 3, mem_percent: 10 }]);
  });

  it('reads a node without telemetry', () => {
    const [n] = parseNodes({ nodes: [{ name: 'pc02', state: 'offline', why: 'timed out' }] });
    expect(n.cpu).toBeNull();
    expect(n.gpus).toEqual([]);
    expect(n.pools).toEqual([]);
  });

  it('reads backends, with pools where given', () => {
    const backends = parseBackends(backendsAnswer);
    expect(backends.engines).toEqual(['ipyparallel', 'dask']);
    expect(backends.backends.map(b => [b.name, b.available, b.pools])).toEqual([
      ['local', true, []],
      ['slurm', false, []],
      ['ssh', true, ['gpu']]
    ]);
  });

  it('falls back to the local backend when the answer says nothing', () => {
    expect(parseBackends({})).toEqual(DEFAULT_BACKENDS);
  });
});

describe('cluster rows', () => {
  it('shows a running cluster as running, with ready/target and its age', () => {
    const view = describeCluster(cluster());
    expect(view).toMatchObject({
      name: 'lounge-1',
      ready: '4/4',
      status: 'running',
      tone: 'ok',
      age: '12 s',
      summary: 'ipyparallel · local · tensorflow',
      canScale: true,
      canInterrupt: true,
      canStop: true,
      canInsert: true,
      stopLabel: 'Stop',
      detail: ''
    });
  });

  it("shows Slurm's pending reason instead of the status while queued", () => {
    const slurm = parseClusters(clustersAnswer)[1];
    expect(clusterStatusText(slurm)).toBe('pending: Resources');
    expect(describeCluster(slurm)).toMatchObject({
      ready: '0/24',
      tone: 'warn',
      summary: 'dask · slurm · 3 nodes'
    });
    expect(clusterStatusText(cluster({ status: 'starting', pending: 'pending (Priority)' }))).toBe(
      'pending (Priority)'
    );
  });

  it('says why a start failed, and offers to remove it', () => {
    const view = describeCluster(
      cluster({ status: 'failed', error: "Preload module 'tensorflw' does not import." })
    );
    expect(view).toMatchObject({
      status: 'failed',
      tone: 'error',
      detail: "Preload module 'tensorflw' does not import.",
      canScale: false,
      canInterrupt: false,
      canInsert: false,
      canStop: true,
      stopLabel: 'Remove'
    });
  });

  it('says a state file cannot be read, and offers to forget it', () => {
    const error =
      "The state file of cluster 'x' (/r/lounge/x.json) cannot be used (JSONDecodeError: " +
      'Expecting value): remove it with `lounge stop x --forget`.';
    const view = describeCluster(
      cluster({ status: 'corrupt', error, engines: '', backend: '', connect_code: '' })
    );
    expect(view).toMatchObject({
      status: 'corrupt',
      tone: 'error',
      detail: error,
      canScale: false,
      canInterrupt: false,
      canInsert: false,
      canStop: true,
      stopLabel: 'Forget'
    });
  });

  it('locks the buttons of a cluster being stopped', () => {
    const view = describeCluster(cluster(), 'stopping');
    expect(view).toMatchObject({
      status: 'stopping',
      tone: 'busy',
      canScale: false,
      canInterrupt: false,
      canStop: false,
      canInsert: false
    });
  });

  it('offers Interrupt only while a cluster runs and nothing else is under way', () => {
    expect(describeCluster(cluster({ status: 'starting' })).canInterrupt).toBe(false);
    expect(describeCluster(cluster(), 'interrupting')).toMatchObject({
      canInterrupt: false,
      canScale: false,
      canStop: false,
      tone: 'busy'
    });
    expect(describeCluster(cluster({ ready: 2, target: 8 })).canInterrupt).toBe(true);
  });

  it('marks a cluster still filling as busy', () => {
    expect(describeCluster(cluster({ ready: 2, target: 8 })).tone).toBe('busy');
    expect(describeCluster(cluster({ status: 'dead' })).tone).toBe('error');
  });
});

describe('runs', () => {
  function run(overrides: Partial<IRunModel> = {}): IRunModel {
    return { ...sweep, ...overrides };
  }

  it("reads a cluster's runs in the server's order, with harmless defaults", () => {
    expect(parseClusters(clustersAnswer)[0].runs).toEqual([sweep]);
    const runs = parseRuns([{ name: 'b', done: '3' }, { total: 4 }, run({ name: 'a' })]);
    expect(runs.map(r => r.name)).toEqual(['b', 'a']);
    expect(runs[0]).toMatchObject({ status: 'unknown', done: 0, error: null, load_code: '' });
    expect(parseRuns('none')).toEqual([]);
  });

  it('shows a running run with its progress, errors and Cancel', () => {
    expect(describeRun(run())).toEqual({
      name: 'sweep-1',
      cluster: 'lounge-1',
      progress: '37/200',
      percent: 19,
      errors: '2 errors',
      status: 'running',
      tone: 'busy',
      detail: '',
      canCancel: true,
      showCancel: true,
      canInsert: true
    });
  });

  it('offers Cancel only while a run is under way', () => {
    for (const status of ['submitted', 'running', 'stalled']) {
      expect(describeRun(run({ status })).showCancel).toBe(true);
    }
    for (const status of ['done', 'cancelled', 'failed']) {
      expect(describeRun(run({ status }))).toMatchObject({ showCancel: false, canCancel: false });
    }
    expect(describeRun(run(), 'cancelling')).toMatchObject({
      status: 'cancelling',
      showCancel: true,
      canCancel: false
    });
  });

  it('says why a run failed or stalled', () => {
    const failed = run({ status: 'failed', error: "its cluster 'lounge-1' is gone" });
    expect(describeRun(failed)).toMatchObject({
      tone: 'error',
      detail: "its cluster 'lounge-1' is gone"
    });
    expect(describeRun(run({ status: 'stalled', error: 'its driver is gone' })).tone).toBe(
      'warn'
    );
  });

  it('marks a finished run ok, or warns when some items raised', () => {
    const done = run({ status: 'done', done: 200, errors: 0, finished: 1764780100 });
    expect(describeRun(done)).toMatchObject({ tone: 'ok', percent: 100, errors: '' });
    expect(describeRun({ ...done, errors: 1 })).toMatchObject({ tone: 'warn', errors: '1 error' });
    expect(describeRun(run({ status: 'cancelled' })).tone).toBe('warn');
  });

  it('has nothing to insert without load code', () => {
    expect(describeRun(run({ load_code: '' })).canInsert).toBe(false);
  });
});

describe('node rows', () => {
  it('shows an idle node with its load', () => {
    expect(describeNode(node())).toEqual({
      name: 'this machine',
      host: 'localhost',
      state: 'idle',
      stateKey: 'idle',
      cpu: '12%',
      mem: '40%',
      gpu: '3% (mem 10%)',
      engines: '4 engines',
      pools: 'local',
      users: ''
    });
  });

  it('says why a node is in use or offline', () => {
    const busy = describeNode(parseNodes(nodesAnswer)[1]);
    expect(busy.state).toBe('in use (ana logged in)');
    expect(busy.stateKey).toBe('in-use');
    expect(busy.users).toBe('ana');
    expect(busy.gpu).toBe('no GPU');
    const off = describeNode(
      node({ name: 'pc02', host: 'pc02', state: 'offline', why: 'no route to host', cpu: null })
    );
    expect(off).toMatchObject({
      host: '',
      state: 'offline (no route to host)',
      stateKey: 'offline',
      cpu: '–'
    });
  });
});

describe('start and scale requests', () => {
  const form: IStartForm = {
    n: ' 4 ',
    backend: 'local',
    engines: 'ipyparallel',
    pool: '',
    preload: 'tensorflow, numpy',
    name: ''
  };

  it('sends the documented body', () => {
    expect(buildStartRequest(form)).toEqual({
      n: 4,
      backend: 'local',
      engines: 'ipyparallel',
      pool: null,
      preload: 'tensorflow,numpy',
      name: null
    });
    expect(
      buildStartRequest({ ...form, backend: 'ssh', pool: ' gpu ', name: 'sweep', preload: '' })
    ).toMatchObject({ backend: 'ssh', pool: 'gpu', name: 'sweep', preload: null });
  });

  it("leaves judging n to the server, whose sentence is the magic's", () => {
    expect(buildStartRequest({ ...form, n: 'four' }).n).toBe('four');
    expect(buildStartRequest({ ...form, n: '0' }).n).toBe(0);
    expect(buildStartRequest({ ...form, n: '-2' }).n).toBe(-2);
    expect('n' in buildStartRequest({ ...form, n: '  ' })).toBe(false);
  });

  it('converts counts and preload lists', () => {
    expect(parseCount('12')).toBe(12);
    expect(parseCount('2.5')).toBe(2.5);
    expect(parseCount('1e3')).toBe('1e3');
    expect(parseCount('')).toBeUndefined();
    expect(normalizePreload(' tensorflow ,, numpy pandas ')).toBe('tensorflow,numpy,pandas');
    expect(normalizePreload(' , ')).toBeNull();
  });

  it('scales to the typed count', () => {
    expect(buildScaleRequest('6')).toEqual({ n: 6 });
    expect(buildScaleRequest('')).toEqual({});
    expect(buildScaleRequest('lots')).toEqual({ n: 'lots' });
  });
});

describe('backend choices', () => {
  const backends = parseBackends(backendsAnswer);

  it('offers every backend, an unavailable one saying why', () => {
    expect(backendChoices(backends)).toEqual([
      { value: 'local', label: 'local', title: '' },
      {
        value: 'slurm',
        label: 'slurm (unavailable: sinfo was not found)',
        title: 'sinfo was not found'
      },
      { value: 'ssh', label: 'ssh', title: '' }
    ]);
  });

  it('selects the first available backend and suggests its pools', () => {
    expect(defaultBackend(backends)).toBe('local');
    expect(
      defaultBackend(
        parseBackends({ backends: [{ name: 'slurm', available: false }, { name: 'ssh' }] })
      )
    ).toBe('ssh');
    expect(poolsFor(backends, 'ssh')).toEqual(['gpu']);
    expect(poolsFor(backends, 'local')).toEqual([]);
    expect(poolsFor(backends, 'nope')).toEqual([]);
  });
});

/** The example `defaults` of docs/rest-api.md's `GET backends`. */
const defaultsAnswer = {
  backend: {
    value: 'ssh',
    source: '/home/u/.ipython/profile_default/ipython_config.py line 3'
  },
  engines: { value: 'ipyparallel', source: 'built-in' },
  preload: {
    value: ['tensorflow', 'numpy'],
    source: '/home/u/.ipython/profile_default/ipython_config.py line 3'
  },
  pool: { value: 'gpu', source: '/etc/lounge.toml line 13 ([start])' },
  timeout: { value: 120.0, source: 'built-in' },
  nodes: { value: null, source: 'built-in' },
  courtesy: { value: false, source: 'built-in' },
  partition: { value: '', source: 'built-in' }
};

describe('start defaults', () => {
  const configured = parseBackends({ ...backendsAnswer, defaults: defaultsAnswer });
  const older = parseBackends(backendsAnswer);
  /** The answer of a server whose defaults set only ``name``, to ``value``. */
  const withDefault = (name: string, value: unknown, source = 'x line 1') =>
    parseBackends({ ...backendsAnswer, defaults: { [name]: { value, source } } });

  it('reads the defaults, dropping entries without a value', () => {
    expect(older.defaults).toEqual({});
    expect(older.defaultsError).toBe('');
    expect(configured.defaultsError).toBe('');
    expect(configured.defaults.pool).toEqual({
      value: 'gpu',
      source: '/etc/lounge.toml line 13 ([start])'
    });
    expect(configured.defaults.nodes).toEqual({ value: null, source: 'built-in' });
    expect(
      parseBackends({
        defaults: { n: 8, pool: { source: 'x' }, name: { value: 'a' }, bad: null }
      }).defaults
    ).toEqual({ name: { value: 'a', source: 'built-in' } });
    expect(parseBackends({ defaults: ['backend'] }).defaults).toEqual({});
  });

  it('opens on the configured backend when the server lists it', () => {
    expect(defaultBackend(configured)).toBe('ssh');
    // an unavailable one too: starting on it gives the server's sentence
    const slurm = withDefault('backend', 'slurm');
    expect(defaultBackend(slurm)).toBe('slurm');
    // one it does not list: today's rule (the first available)
    const unknown = withDefault('backend', 'k8s');
    expect(defaultBackend(unknown)).toBe('local');
    expect(defaultBackend(older)).toBe('local');
  });

  it('opens on the configured engine kind when the server lists it', () => {
    const dask = withDefault('engines', 'dask');
    expect(defaultEngines(dask)).toBe('dask');
    expect(defaultEngines(configured)).toBe('ipyparallel');
    const unknown = withDefault('engines', 'ray');
    expect(defaultEngines(unknown)).toBe('ipyparallel');
    expect(defaultEngines(older)).toBe('ipyparallel');
  });

  it('fills the pool only for a backend that takes one', () => {
    expect(takesPool(configured, 'ssh')).toBe(true);
    expect(takesPool(configured, 'local')).toBe(false);
    expect(takesPool(configured, 'nope')).toBe(false);
    expect(defaultPool(configured, 'ssh')).toBe('gpu');
    expect(defaultPool(configured, 'local')).toBe('');
    expect(defaultPool(configured, 'slurm')).toBe('');
    expect(defaultPool(older, 'ssh')).toBe('');
  });

  it('shows the preload list as the text field types it', () => {
    expect(defaultPreload(configured)).toBe('tensorflow,numpy');
    expect(defaultPreload(older)).toBe('');
    const text = withDefault('preload', ' json, os ');
    expect(defaultPreload(text)).toBe('json,os');
    const empty = withDefault('preload', [], 'built-in');
    expect(defaultPreload(empty)).toBe('');
    // and the start it sends holds what the field holds
    expect(
      buildStartRequest({
        n: defaultCount(configured),
        backend: defaultBackend(configured),
        engines: defaultEngines(configured),
        pool: defaultPool(configured, 'ssh'),
        preload: defaultPreload(configured),
        name: ''
      })
    ).toEqual({
      n: 4,
      backend: 'ssh',
      engines: 'ipyparallel',
      pool: 'gpu',
      preload: 'tensorflow,numpy',
      name: null
    });
  });

  it('opens on 4 engines unless n is configured', () => {
    expect(defaultCount(older)).toBe('4');
    expect(defaultCount(withDefault('n', 16))).toBe('16');
    expect(defaultCount(withDefault('n', null))).toBe('4');
  });

  it('turns a value into the text of a field', () => {
    expect(defaultText(['a', ' b ', '', null])).toBe('a,b');
    expect(defaultText(null)).toBe('');
    expect(defaultText(undefined)).toBe('');
    expect(defaultText(' x ')).toBe('x');
    expect(defaultText(120.5)).toBe('120.5');
    expect(defaultText(false)).toBe('false');
    expect(defaultText({ a: 1 })).toBe('');
  });

  it('shortens a source to its file base name', () => {
    const cases: [string, string][] = [
      ['/home/u/.ipython/profile_default/ipython_config.py line 3', 'ipython_config.py line 3'],
      ['/etc/lounge.toml line 12 ([start])', 'lounge.toml line 12 ([start])'],
      ['/home/u/My Documents/lounge.toml line 2 ([start])', 'lounge.toml line 2 ([start])'],
      [
        'C:\\Users\\ana\\.ipython\\profile_default\\ipython_config.py line 7',
        'ipython_config.py line 7'
      ],
      ['built-in', 'built-in'],
      ['jupyter_server_config.py line 4', 'jupyter_server_config.py line 4'],
      ['the inventory /etc/lounge.toml ([start])', 'the inventory lounge.toml ([start])'],
      [
        '$JUPYTER_LOUNGE_INVENTORY=/srv/x/lounge.toml line 5',
        '$JUPYTER_LOUNGE_INVENTORY=lounge.toml line 5'
      ]
    ];
    for (const [source, short] of cases) {
      expect(shortSource(source)).toBe(short);
    }
  });

  it('says where the configured defaults came from, grouped by source', () => {
    expect(describeDefaults(configured)).toEqual({
      text:
        'Defaults: backend, preload from ipython_config.py line 3; ' +
        'pool from lounge.toml line 13 ([start])',
      title:
        'backend, preload from /home/u/.ipython/profile_default/ipython_config.py line 3\n' +
        'pool from /etc/lounge.toml line 13 ([start])'
    });
  });

  it('reads why the configured defaults could not be read', () => {
    const broken = parseBackends({
      ...backendsAnswer,
      defaults: { backend: { value: 'local', source: 'built-in' } },
      defaults_error: "/etc/lounge.toml line 4: [start] has no option 'engine'. "
    });
    expect(broken.defaultsError).toBe("/etc/lounge.toml line 4: [start] has no option 'engine'.");
    expect(describeDefaults(broken).text).toBe('');
    expect(parseBackends({ defaults_error: null }).defaultsError).toBe('');
  });

  it('says nothing when every default is built in, or none was sent', () => {
    const builtIn = parseBackends({
      defaults: { backend: { value: 'local', source: 'built-in' }, n: { value: 4 } }
    });
    expect(describeDefaults(builtIn)).toEqual({ text: '', title: '' });
    expect(describeDefaults(older)).toEqual({ text: '', title: '' });
  });
});

describe('LoungeState', () => {
  it('keeps an action error through refreshes until the next action', () => {
    const state = new LoungeState();
    state.setError('A cluster named lounge-1 already exists.', 'action');
    state.setError('Could not reach the Jupyter server: offline', 'refresh');
    expect(state.error).toBe('A cluster named lounge-1 already exists.');
    state.refreshed();
    expect(state.error).toBe('A cluster named lounge-1 already exists.');
    state.clearError();
    expect(state.error).toBe('');
    expect(state.errorSource).toBeNull();
  });

  it('clears a refresh error on the next good refresh', () => {
    const state = new LoungeState();
    state.setError('Could not reach the Jupyter server: offline', 'refresh');
    expect(state.errorSource).toBe('refresh');
    state.refreshed();
    expect(state.error).toBe('');
  });

  it('describes rows with what is in flight', () => {
    const state = new LoungeState();
    expect(state.loaded).toBe(false);
    state.setClusters(parseClusters(clustersAnswer));
    state.setNodes(parseNodes(nodesAnswer));
    expect(state.loaded).toBe(true);
    state.setBusy('lounge-1', 'stopping');
    expect(state.clusterViews().map(v => [v.name, v.status])).toEqual([
      ['lounge-1', 'stopping'],
      ['lounge-2', 'pending: Resources']
    ]);
    state.setBusy('lounge-1', undefined);
    expect(state.busy('lounge-1')).toBeUndefined();
    expect(state.clusterViews()[0].status).toBe('running');
    expect(state.nodeViews().map(v => v.name)).toEqual(['this machine', 'pc01']);
    expect(state.cluster('lounge-2')?.backend).toBe('slurm');
    expect(state.cluster('nope')).toBeUndefined();
  });

  it("describes a cluster's runs, a cancel in flight marking its run only", () => {
    const state = new LoungeState();
    state.setClusters(parseClusters(clustersAnswer));
    state.setBusy(runKey('lounge-1', 'sweep-1'), 'cancelling');
    expect(state.runViews('lounge-1').map(v => [v.name, v.status])).toEqual([
      ['sweep-1', 'cancelling']
    ]);
    expect(state.clusterViews()[0].status).toBe('running');
    expect(state.runViews('lounge-2')).toEqual([]);
    expect(state.runViews('nope')).toEqual([]);
    expect(state.run('lounge-1', 'sweep-1')?.total).toBe(200);
    expect(state.run('lounge-1', 'nope')).toBeUndefined();
  });
});

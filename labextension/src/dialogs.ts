/**
 * The bodies of the start and scale dialogs (JupyterLab `Dialog`s). They only collect
 * what is typed; model.ts turns it into the request and the server checks it.
 */

import { Dialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import {
  backendChoices,
  defaultBackend,
  defaultCount,
  defaultEngines,
  defaultPool,
  defaultPreload,
  describeDefaults,
  IBackendsModel,
  IClusterModel,
  IStartForm,
  poolsFor
} from './model';

let datalistCount = 0;

function input(testid: string, value: string, placeholder = ''): HTMLInputElement {
  const node = document.createElement('input');
  node.type = 'text';
  node.className = 'jp-mod-styled jp-lounge-Input';
  node.dataset.testid = testid;
  node.value = value;
  node.placeholder = placeholder;
  node.spellcheck = false;
  return node;
}

function select(testid: string): HTMLSelectElement {
  const node = document.createElement('select');
  node.className = 'jp-mod-styled jp-lounge-Select';
  node.dataset.testid = testid;
  return node;
}

function option(value: string, label: string, title = ''): HTMLOptionElement {
  const node = document.createElement('option');
  node.value = value;
  node.textContent = label;
  if (title) {
    node.title = title;
  }
  return node;
}

function field(label: string, control: HTMLElement, hint?: HTMLElement): HTMLElement {
  const node = document.createElement('label');
  node.className = 'jp-lounge-Field';
  const text = document.createElement('span');
  text.className = 'jp-lounge-FieldLabel';
  text.textContent = label;
  node.append(text, control);
  if (hint) {
    node.append(hint);
  }
  return node;
}

/**
 * n, backend, engine kind, pool, preload and name of a new cluster. It opens on the
 * effective defaults the server sends with its backends (the IPython profile's, the
 * server config's, the inventory's `[start]`) and says where the configured ones came
 * from; a server that sends none gets the built-in ones.
 */
export class StartForm extends Widget implements Dialog.IBodyWidget<IStartForm> {
  constructor(backends: IBackendsModel) {
    super();
    this.addClass('jp-lounge-Form');
    this._backends = backends;

    this._n = input('lounge-start-n', defaultCount(backends));
    this._n.inputMode = 'numeric';

    this._backend = select('lounge-start-backend');
    for (const choice of backendChoices(backends)) {
      this._backend.append(option(choice.value, choice.label, choice.title));
    }
    this._backend.value = defaultBackend(backends);

    this._engines = select('lounge-start-engines');
    for (const kind of backends.engines) {
      this._engines.append(option(kind, kind));
    }
    this._engines.value = defaultEngines(backends);

    this._pools = document.createElement('datalist');
    this._pools.id = `jp-lounge-pools-${++datalistCount}`;
    this._pool = input(
      'lounge-start-pool',
      defaultPool(backends, this._backend.value),
      'any node'
    );
    this._pool.setAttribute('list', this._pools.id);
    // Until the person types a pool, it follows the backend (a pool only where one is taken).
    this._pool.addEventListener('input', () => (this._poolTyped = true), { once: true });

    this._preload = input(
      'lounge-start-preload',
      defaultPreload(backends),
      'e.g. tensorflow,numpy'
    );
    this._name = input('lounge-start-name', '', 'lounge-1, lounge-2, ... if blank');

    this._backendHint = document.createElement('span');
    this._backendHint.className = 'jp-lounge-Hint';
    this._backend.addEventListener('change', () => this._backendChanged());

    this.node.append(
      field('Engines', this._n),
      field('Backend', this._backend, this._backendHint),
      field('Engine kind', this._engines),
      field('Pool', this._pool),
      this._pools,
      field('Preload modules', this._preload),
      field('Name', this._name)
    );
    const note = describeDefaults(backends);
    if (note.text) {
      const where = document.createElement('div');
      where.className = 'jp-lounge-Defaults';
      where.dataset.testid = 'lounge-start-defaults';
      where.textContent = note.text;
      where.title = note.title;
      this.node.append(where);
    }
    if (backends.defaultsError) {
      const error = document.createElement('div');
      error.className = 'jp-lounge-Hint';
      error.dataset.testid = 'lounge-start-defaults-error';
      error.textContent = backends.defaultsError;
      this.node.append(error);
    }
    this._backendChanged();
  }

  getValue(): IStartForm {
    return {
      n: this._n.value,
      backend: this._backend.value,
      engines: this._engines.value,
      pool: this._pool.value,
      preload: this._preload.value,
      name: this._name.value
    };
  }

  private _backendChanged(): void {
    const name = this._backend.value;
    const backend = this._backends.backends.find(b => b.name === name);
    this._backendHint.textContent =
      backend && !backend.available ? backend.why || 'not available here' : '';
    this._pools.replaceChildren(
      ...poolsFor(this._backends, name).map(pool => option(pool, pool))
    );
    if (!this._poolTyped) {
      this._pool.value = defaultPool(this._backends, name);
    }
  }

  private _backends: IBackendsModel;
  private _n: HTMLInputElement;
  private _backend: HTMLSelectElement;
  private _backendHint: HTMLElement;
  private _engines: HTMLSelectElement;
  private _pool: HTMLInputElement;
  private _pools: HTMLDataListElement;
  private _poolTyped = false;
  private _preload: HTMLInputElement;
  private _name: HTMLInputElement;
}

/** The new engine count of a cluster. */
export class ScaleForm extends Widget implements Dialog.IBodyWidget<string> {
  constructor(cluster: IClusterModel) {
    super();
    this.addClass('jp-lounge-Form');
    this._n = input('lounge-scale-n', String(cluster.target));
    this._n.inputMode = 'numeric';
    this.node.append(
      field(`Engines (now ${cluster.ready} ready of ${cluster.target})`, this._n)
    );
  }

  getValue(): string {
    return this._n.value;
  }

  private _n: HTMLInputElement;
}

/**
 * The Lounge sidebar: the clusters (with start, scale, stop and insert-connect-code),
 * each with its runs (progress, cancel, insert-load-code), and the nodes of the lounge,
 * refreshed by a Lumino Poll. The DOM contract (the
 * data-testid attributes) is in docs/rest-api.md; rows are keyed by name so that a
 * refresh updates them in place and a button being clicked is never replaced.
 */

import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { Message } from '@lumino/messaging';
import { Poll } from '@lumino/polling';
import { h, VirtualDOM, VirtualElement } from '@lumino/virtualdom';
import { Widget } from '@lumino/widgets';

import { errorMessage, LoungeAPI } from './api';
import { ScaleForm, StartForm } from './dialogs';
import { connectSnippet } from './format';
import { loungeIcon } from './icons';
import {
  buildScaleRequest,
  buildStartRequest,
  Busy,
  describeCluster,
  IClusterView,
  INodeView,
  IRunView,
  LoungeState,
  runKey
} from './model';

export const SIDEBAR_ID = 'jupyter-lounge-sidebar';

/** Refresh every 2 s while shown. */
export const REFRESH_INTERVAL_MS = 2000;

/** On errors the interval grows up to this. */
export const MAX_BACKOFF_MS = 30000;

/**
 * `disabled` unless enabled. Lumino's virtual DOM writes every attribute it is given, an
 * undefined one as "undefined", so a boolean attribute must be left out to be off.
 */
function disabledUnless(enabled: boolean): { disabled?: string } {
  return enabled ? {} : { disabled: '' };
}

export namespace LoungeSidebar {
  export interface IOptions {
    api?: LoungeAPI;
    /** Where "insert connect code" writes; without it that button says so. */
    notebooks?: INotebookTracker | null;
    /** Brings a widget to the front (the shell's activateById). */
    activate?: (id: string) => void;
  }
}

export class LoungeSidebar extends Widget {
  readonly state = new LoungeState();

  constructor(options: LoungeSidebar.IOptions = {}) {
    super();
    this.id = SIDEBAR_ID;
    this.title.caption = 'Lounge';
    this.title.icon = loungeIcon;
    this.addClass('jp-lounge-Sidebar');
    this._api = options.api ?? new LoungeAPI();
    this._notebooks = options.notebooks ?? null;
    this._activate = options.activate ?? (() => undefined);
    this._poll = new Poll({
      auto: true,
      factory: () => this._refresh(),
      frequency: {
        interval: REFRESH_INTERVAL_MS,
        backoff: true,
        max: MAX_BACKOFF_MS
      },
      name: 'jupyter-lounge:refresh',
      // 'when-hidden' stands by while the browser tab is hidden; the sidebar itself
      // being collapsed stands by too.
      standby: () => !this.isVisible || 'when-hidden'
    });
    this._render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    super.dispose();
  }

  /**
   * Refresh now; the poll goes on from here. Unlike Poll.refresh(), which is dropped
   * while a refresh is in flight, this always asks again: that earlier answer may predate
   * the action that just ended (the seq check in _refresh keeps it from showing last).
   */
  refresh(): Promise<void> {
    return this._poll.schedule({ interval: Poll.IMMEDIATE, phase: 'refreshed' });
  }

  /** Ask for a new cluster in a dialog and start it. */
  async start(): Promise<void> {
    this.state.clearError();
    try {
      this.state.backends = await this._api.backends();
    } catch (error) {
      // Still offer the dialog, with the backends known so far.
      this._fail(error);
    }
    const result = await showDialog({
      title: 'Start lounge engines',
      body: new StartForm(this.state.backends),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Start' })],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept || result.value === null) {
      return;
    }
    this.state.clearError();
    this._render();
    try {
      await this._api.start(buildStartRequest(result.value));
    } catch (error) {
      this._fail(error);
    }
    void this.refresh();
  }

  /** Ask for the new engine count of a cluster and set it. */
  async scale(name: string): Promise<void> {
    const cluster = this.state.cluster(name);
    if (!cluster) {
      return;
    }
    const result = await showDialog({
      title: `Scale ${name}`,
      body: new ScaleForm(cluster),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Scale' })],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept || result.value === null) {
      return;
    }
    await this._act(name, 'scaling', () =>
      this._api.scale(name, buildScaleRequest(result.value ?? ''))
    );
  }

  /** Interrupt the running work on every engine of a cluster, as Ctrl-C does in a
   * notebook; the sentence the server answers says what was done. */
  async interrupt(name: string): Promise<void> {
    await this._act(name, 'interrupting', async () => {
      Notification.info(await this._api.interrupt(name), { autoClose: 8000 });
    });
  }

  /** Confirm, then stop a cluster (or remove a failed start, or forget a corrupt one). */
  async stop(name: string): Promise<void> {
    const cluster = this.state.cluster(name);
    if (!cluster) {
      return;
    }
    const view = describeCluster(cluster);
    const body =
      cluster.status === 'failed'
        ? `The start of ${name} failed; remove it from the list.`
        : cluster.status === 'corrupt'
          ? `The state file of ${name} cannot be read: every process and Slurm job its ` +
            'folder names is stopped, and its record removed.'
          : `Its engines, node agents and controller stop; work running on them is lost.`;
    const result = await showDialog({
      title: `${view.stopLabel} ${name}?`,
      body,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: view.stopLabel })]
    });
    if (!result.button.accept) {
      return;
    }
    await this._act(name, 'stopping', () => this._api.stop(name));
  }

  /** Confirm, then cancel a run: no more batches go out and those out are interrupted;
   * its rows so far stay readable. */
  async cancelRun(cluster: string, run: string): Promise<void> {
    const result = await showDialog({
      title: `Cancel run ${run}?`,
      body:
        `No more of its items go out to the engines of ${cluster}, and those running are ` +
        'interrupted; the rows done so far stay readable.',
      buttons: [
        Dialog.cancelButton({ label: 'Keep running' }),
        Dialog.warnButton({ label: 'Cancel run' })
      ]
    });
    if (!result.button.accept) {
      return;
    }
    await this._act(runKey(cluster, run), 'cancelling', async () => {
      Notification.info(await this._api.cancelRun(cluster, run), { autoClose: 8000 });
    });
  }

  /** Put a cluster's connect code into the active notebook, below its active cell. */
  insertConnectCode(name: string): void {
    const cluster = this.state.cluster(name);
    if (cluster) {
      this._insertCode(connectSnippet(cluster), `the connect code of ${name}`);
    } else {
      this._missing(`There is no cluster named '${name}' any more.`);
    }
  }

  /** Put the code that loads a run's DataFrame into the active notebook. */
  insertRunCode(cluster: string, name: string): void {
    const run = this.state.run(cluster, name);
    if (run && run.load_code) {
      this._insertCode(run.load_code, `the code that loads run ${name}`);
    } else {
      this._missing(`Cluster '${cluster}' has no run named '${name}' any more.`);
    }
  }

  /**
   * Put `code` into the active notebook as a new code cell below the active cell; `what`
   * names it in the error when there is no notebook.
   */
  private _insertCode(code: string, what: string): void {
    this.state.clearError();
    const panel = this._notebooks?.currentWidget ?? null;
    if (!panel || !panel.content.model) {
      this.state.setError(
        `Open a notebook first: ${what} goes into the active notebook, below its active cell.`,
        'action'
      );
    } else {
      const notebook = panel.content;
      NotebookActions.insertBelow(notebook);
      if (notebook.activeCell && notebook.activeCell.model.type !== 'code') {
        NotebookActions.changeCellType(notebook, 'code');
      }
      const cell = notebook.activeCell;
      if (cell) {
        cell.model.sharedModel.setSource(code);
        this._activate(panel.id);
      } else {
        this.state.setError(
          `Could not add a cell to ${panel.title.label || 'the notebook'}.`,
          'action'
        );
      }
    }
    this._render();
    void this.refresh();
  }

  private _missing(message: string): void {
    this.state.setError(message, 'action');
    this._render();
    void this.refresh();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.refresh();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      void this.refresh();
    }
  }

  /** One refresh: clusters and nodes, asked at once; an error makes the poll back off. */
  private async _refresh(): Promise<void> {
    const seq = ++this._started;
    const [clusters, nodes] = await Promise.allSettled([
      this._api.clusters(),
      this._api.nodes()
    ]);
    if (seq < this._applied || this.isDisposed) {
      // A later refresh (one right after an action, say) answered first: this older
      // answer would bring back a cluster that has just been stopped.
      return;
    }
    this._applied = seq;
    if (clusters.status === 'fulfilled') {
      this.state.setClusters(clusters.value);
    }
    if (nodes.status === 'fulfilled') {
      this.state.setNodes(nodes.value);
    }
    const failure =
      clusters.status === 'rejected'
        ? clusters.reason
        : nodes.status === 'rejected'
          ? nodes.reason
          : undefined;
    if (failure !== undefined) {
      this.state.setError(errorMessage(failure), 'refresh');
      this._render();
      throw failure;
    }
    this.state.refreshed();
    this._render();
  }

  /** Run a cluster action, its row marked busy meanwhile, then refresh at once. */
  private async _act(
    name: string,
    busy: Busy,
    action: () => Promise<unknown>
  ): Promise<void> {
    this.state.clearError();
    this.state.setBusy(name, busy);
    this._render();
    try {
      await action();
    } catch (error) {
      this._fail(error);
    } finally {
      this.state.setBusy(name, undefined);
      this._render();
      void this.refresh();
    }
  }

  private _fail(error: unknown): void {
    this.state.setError(errorMessage(error), 'action');
    this._render();
  }

  private _render(): void {
    if (this.isDisposed) {
      return;
    }
    VirtualDOM.render(
      [
        this._renderHeader(),
        this._renderError(),
        this._renderClusters(),
        this._renderNodes()
      ],
      this.node
    );
  }

  private _renderHeader(): VirtualElement {
    return h.div(
      { className: 'jp-lounge-Header' },
      h.span({ className: 'jp-lounge-Title' }, 'Lounge'),
      h.button(
        {
          className: 'jp-lounge-Button jp-mod-accept',
          dataset: { testid: 'lounge-start' },
          title: 'Start engines on this machine, Slurm or the lounge',
          onclick: () => void this.start()
        },
        'Start…'
      ),
      h.button(
        {
          className: 'jp-lounge-Button',
          dataset: { testid: 'lounge-refresh' },
          title: 'Refresh now',
          onclick: () => void this.refresh()
        },
        'Refresh'
      )
    );
  }

  private _renderError(): VirtualElement {
    const error = this.state.error;
    return h.div(
      {
        className: 'jp-lounge-ErrorBox',
        ...(error ? {} : { hidden: '' })
      },
      h.div(
        {
          className: 'jp-lounge-Error',
          dataset: { testid: 'lounge-error' },
          role: 'alert'
        },
        error
      ),
      h.button(
        {
          className: 'jp-lounge-Dismiss',
          title: 'Dismiss',
          'aria-label': 'Dismiss the error',
          onclick: () => {
            this.state.clearError();
            this._render();
          }
        },
        '×'
      )
    );
  }

  private _renderClusters(): VirtualElement {
    const views = this.state.clusterViews();
    return h.section(
      {
        className: 'jp-lounge-Panel',
        dataset: { testid: 'lounge-clusters' }
      },
      h.h3({ className: 'jp-lounge-PanelTitle' }, 'Clusters'),
      views.length
        ? views.map(view => this._renderCluster(view))
        : h.div(
            { className: 'jp-lounge-Empty' },
            this.state.loaded
              ? 'No cluster. Start one here, or with %lounge start in a notebook.'
              : 'Loading…'
          )
    );
  }

  private _renderCluster(view: IClusterView): VirtualElement {
    const name = view.name;
    return h.div(
      {
        key: name,
        className: `jp-lounge-ClusterItem jp-lounge-tone-${view.tone}`,
        dataset: { testid: 'lounge-cluster-row', cluster: name }
      },
      h.div(
        { className: 'jp-lounge-Line' },
        h.span({ className: 'jp-lounge-ClusterName', title: name }, name),
        h.span(
          {
            className: 'jp-lounge-ClusterReady',
            dataset: { testid: 'lounge-cluster-ready' },
            title: 'engines ready / target'
          },
          view.ready
        )
      ),
      h.div(
        { className: 'jp-lounge-Line jp-lounge-Meta' },
        h.span({ className: 'jp-lounge-ClusterSummary' }, view.summary),
        h.span({ className: 'jp-lounge-ClusterAge', title: 'age' }, view.age)
      ),
      h.div(
        {
          className: `jp-lounge-ClusterStatus jp-lounge-tone-${view.tone}`,
          dataset: { testid: 'lounge-cluster-status' },
          title: view.status
        },
        view.status
      ),
      view.detail
        ? h.div(
            {
              className: 'jp-lounge-ClusterDetail',
              dataset: { testid: 'lounge-cluster-error' }
            },
            view.detail
          )
        : null,
      h.div(
        { className: 'jp-lounge-Actions' },
        h.button(
          {
            className: 'jp-lounge-Button',
            dataset: { testid: 'lounge-scale' },
            title: `Change the number of engines of ${name}`,
            ...disabledUnless(view.canScale),
            onclick: () => void this.scale(name)
          },
          'Scale…'
        ),
        h.button(
          {
            className: 'jp-lounge-Button',
            dataset: { testid: 'lounge-interrupt' },
            title: `Interrupt the running work on every engine of ${name} (the cluster keeps running)`,
            ...disabledUnless(view.canInterrupt),
            onclick: () => void this.interrupt(name)
          },
          'Interrupt'
        ),
        h.button(
          {
            className: 'jp-lounge-Button jp-mod-warn',
            dataset: { testid: 'lounge-stop' },
            title: `${view.stopLabel} ${name}`,
            ...disabledUnless(view.canStop),
            onclick: () => void this.stop(name)
          },
          view.stopLabel
        ),
        h.button(
          {
            className: 'jp-lounge-Button',
            dataset: { testid: 'lounge-insert' },
            title: `Insert the code that connects to ${name} below the active notebook cell`,
            ...disabledUnless(view.canInsert),
            onclick: () => this.insertConnectCode(name)
          },
          'Insert code'
        )
      ),
      this._renderRuns(name)
    );
  }

  /** A cluster's runs, oldest first; nothing when it has none. */
  private _renderRuns(cluster: string): VirtualElement | null {
    const views = this.state.runViews(cluster);
    if (!views.length) {
      return null;
    }
    return h.div(
      { className: 'jp-lounge-Runs', dataset: { testid: 'lounge-runs' } },
      views.map(view => this._renderRun(cluster, view))
    );
  }

  private _renderRun(cluster: string, view: IRunView): VirtualElement {
    const name = view.name;
    return h.div(
      {
        key: name,
        className: `jp-lounge-RunItem jp-lounge-tone-${view.tone}`,
        dataset: { testid: 'lounge-run', run: name, status: view.status }
      },
      h.div(
        { className: 'jp-lounge-Line' },
        h.span({ className: 'jp-lounge-RunName', title: name }, name),
        h.span(
          {
            className: 'jp-lounge-RunProgress',
            dataset: { testid: 'lounge-run-progress' },
            title: 'items done / items'
          },
          view.progress
        )
      ),
      h.div(
        {
          className: 'jp-lounge-ProgressBar',
          role: 'progressbar',
          'aria-label': `Progress of run ${name}`,
          'aria-valuemin': '0',
          'aria-valuemax': '100',
          'aria-valuenow': String(view.percent)
        },
        h.div({
          className: 'jp-lounge-ProgressFill',
          style: { width: `${view.percent}%` }
        })
      ),
      h.div(
        { className: 'jp-lounge-Line jp-lounge-Meta' },
        h.span(
          {
            className: `jp-lounge-RunStatus jp-lounge-tone-${view.tone}`,
            dataset: { testid: 'lounge-run-status' }
          },
          view.status
        ),
        view.errors
          ? h.span(
              {
                className: 'jp-lounge-RunErrors',
                dataset: { testid: 'lounge-run-errors' },
                title: 'items whose call raised: their rows hold the error'
              },
              view.errors
            )
          : null
      ),
      view.detail
        ? h.div(
            {
              className: 'jp-lounge-ClusterDetail',
              dataset: { testid: 'lounge-run-error' }
            },
            view.detail
          )
        : null,
      h.div(
        { className: 'jp-lounge-Actions' },
        view.showCancel
          ? h.button(
              {
                className: 'jp-lounge-Button jp-mod-warn',
                dataset: { testid: 'lounge-run-cancel' },
                title: `Cancel run ${name} (its rows so far stay readable)`,
                ...disabledUnless(view.canCancel),
                onclick: () => void this.cancelRun(cluster, name)
              },
              'Cancel'
            )
          : null,
        h.button(
          {
            className: 'jp-lounge-Button',
            dataset: { testid: 'lounge-run-insert' },
            title: `Insert the code that loads the table of run ${name} below the active notebook cell`,
            ...disabledUnless(view.canInsert),
            onclick: () => this.insertRunCode(cluster, name)
          },
          'Insert code'
        )
      )
    );
  }

  private _renderNodes(): VirtualElement {
    const views = this.state.nodeViews();
    return h.section(
      {
        className: 'jp-lounge-Panel',
        dataset: { testid: 'lounge-nodes' }
      },
      h.h3({ className: 'jp-lounge-PanelTitle' }, 'Nodes'),
      views.length
        ? views.map(view => this._renderNode(view))
        : h.div(
            { className: 'jp-lounge-Empty' },
            this.state.loaded ? 'No node answered.' : 'Loading…'
          )
    );
  }

  private _renderNode(view: INodeView): VirtualElement {
    const metric = (label: string, value: string) =>
      h.span(
        { className: 'jp-lounge-Metric' },
        h.span({ className: 'jp-lounge-MetricLabel' }, label),
        ` ${value}`
      );
    const meta = [view.engines, `pools: ${view.pools}`];
    if (view.users) {
      meta.push(`users: ${view.users}`);
    }
    return h.div(
      {
        key: view.name,
        className: `jp-lounge-NodeItem jp-lounge-state-${view.stateKey}`,
        dataset: {
          testid: 'lounge-node-row',
          node: view.name,
          state: view.stateKey
        }
      },
      h.div(
        { className: 'jp-lounge-Line' },
        h.span({ className: 'jp-lounge-NodeName', title: view.name }, view.name),
        view.host ? h.span({ className: 'jp-lounge-NodeHost' }, view.host) : null
      ),
      h.div(
        {
          className: 'jp-lounge-NodeState',
          dataset: { testid: 'lounge-node-state' }
        },
        view.state
      ),
      h.div(
        { className: 'jp-lounge-Metrics' },
        metric('CPU', view.cpu),
        metric('Mem', view.mem),
        metric('GPU', view.gpu)
      ),
      h.div({ className: 'jp-lounge-Meta' }, meta.join(' · '))
    );
  }

  private _api: LoungeAPI;
  private _notebooks: INotebookTracker | null;
  private _activate: (id: string) => void;
  private _poll: Poll;
  /** Refreshes started, and the latest one whose answer is shown. */
  private _started = 0;
  private _applied = 0;
}

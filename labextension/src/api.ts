/**
 * Requests to the lounge REST API of the Jupyter server (docs/rest-api.md). Every
 * request goes through ServerConnection.makeRequest, which adds the token and the XSRF
 * header like the rest of JupyterLab; every failure becomes a LoungeAPIError whose
 * message is a sentence a person can read (the server's own `message` when it sent one).
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { readableError } from './format';
import {
  IBackendsModel,
  IClusterModel,
  INodeModel,
  IScaleRequest,
  IStartRequest,
  parseBackends,
  parseCluster,
  parseClusters,
  parseNodes
} from './model';

/** The route prefix of the lounge server extension. */
export const API_NAMESPACE = 'jupyter-lounge';

export class LoungeAPIError extends Error {
  /** The HTTP status, or 0 when the server could not be reached. */
  readonly status: number;

  constructor(message: string, status: number) {
    super(message);
    this.name = 'LoungeAPIError';
    this.status = status;
  }
}

/** Any thrown value as the sentence to show. */
export function errorMessage(error: unknown): string {
  if (error instanceof Error && error.message) {
    return error.message;
  }
  return String(error);
}

/**
 * Call a lounge route and return its JSON answer (undefined for an empty one, like the
 * 204 of DELETE).
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, API_NAMESPACE, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new LoungeAPIError(
      `Could not reach the Jupyter server: ${errorMessage(error)}`,
      0
    );
  }
  let body = '';
  try {
    body = await response.text();
  } catch {
    body = '';
  }
  if (!response.ok) {
    throw new LoungeAPIError(
      readableError(response.status, response.statusText, body),
      response.status
    );
  }
  if (body.trim() === '') {
    return undefined as T;
  }
  try {
    return JSON.parse(body) as T;
  } catch {
    throw new LoungeAPIError(
      `The Jupyter server answered ${url} with something that is not JSON.`,
      response.status
    );
  }
}

function clusterPath(name: string): string {
  return `clusters/${encodeURIComponent(name)}`;
}

/** The lounge routes, typed. One instance per sidebar. */
export class LoungeAPI {
  constructor(
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  async clusters(): Promise<IClusterModel[]> {
    return parseClusters(await this._request('clusters'));
  }

  async nodes(): Promise<INodeModel[]> {
    return parseNodes(await this._request('nodes'));
  }

  async backends(): Promise<IBackendsModel> {
    return parseBackends(await this._request('backends'));
  }

  /** Starts in the server; answers at once with the name (202). */
  async start(request: IStartRequest): Promise<{ name: string; status: string }> {
    const answer = await this._request<{ name?: unknown; status?: unknown }>(
      'clusters',
      { method: 'POST', body: JSON.stringify(request) }
    );
    return {
      name: typeof answer?.name === 'string' ? answer.name : '',
      status: typeof answer?.status === 'string' ? answer.status : 'starting'
    };
  }

  async scale(name: string, request: IScaleRequest): Promise<IClusterModel> {
    return parseCluster(
      await this._request(clusterPath(name), {
        method: 'PATCH',
        body: JSON.stringify(request)
      })
    );
  }

  /** Interrupts the running work on every engine; answers with what was done. */
  async interrupt(name: string): Promise<string> {
    const answer = await this._request<{ message?: unknown }>(
      `${clusterPath(name)}/interrupt`,
      { method: 'POST' }
    );
    return typeof answer?.message === 'string' ? answer.message : `Interrupted ${name}.`;
  }

  /** Cancels a run (its rows so far stay); answers with what was done. */
  async cancelRun(cluster: string, run: string): Promise<string> {
    const answer = await this._request<{ message?: unknown }>(
      `${clusterPath(cluster)}/runs/${encodeURIComponent(run)}/cancel`,
      { method: 'POST' }
    );
    return typeof answer?.message === 'string' ? answer.message : `Cancelled ${run}.`;
  }

  /** Answers once nothing of the cluster is left running. */
  async stop(name: string): Promise<void> {
    await this._request(clusterPath(name), { method: 'DELETE' });
  }

  private _request<T = unknown>(endPoint: string, init: RequestInit = {}): Promise<T> {
    return requestAPI<T>(endPoint, init, this._settings);
  }
}

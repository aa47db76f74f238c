/**
 * jupyter_lounge's JupyterLab extension: only wires the sidebar into the application.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';

import { addCommands } from './commands';
import { LoungeSidebar } from './sidebar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-lounge:plugin',
  description:
    'A sidebar with the nodes of the lounge and the engine clusters of jupyter_lounge.',
  autoStart: true,
  optional: [ILayoutRestorer, INotebookTracker, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    notebooks: INotebookTracker | null,
    palette: ICommandPalette | null
  ): void => {
    const sidebar = new LoungeSidebar({
      notebooks,
      activate: id => app.shell.activateById(id)
    });
    app.shell.add(sidebar, 'left', { rank: 250 });
    restorer?.add(sidebar, sidebar.id);
    addCommands(app, sidebar, palette);
  }
};

export default plugin;

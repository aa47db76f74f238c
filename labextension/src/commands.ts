import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';

import { LoungeSidebar } from './sidebar';

export namespace CommandIDs {
  export const open = 'jupyter-lounge:open';
  export const start = 'jupyter-lounge:start';
  export const refresh = 'jupyter-lounge:refresh';
}

/** The sidebar's actions as commands, in the palette when there is one. */
export function addCommands(
  app: JupyterFrontEnd,
  sidebar: LoungeSidebar,
  palette: ICommandPalette | null
): void {
  app.commands.addCommand(CommandIDs.open, {
    label: 'Show the Lounge Sidebar',
    execute: () => app.shell.activateById(sidebar.id)
  });
  app.commands.addCommand(CommandIDs.start, {
    label: 'Start Lounge Engines…',
    execute: async () => {
      app.shell.activateById(sidebar.id);
      await sidebar.start();
    }
  });
  app.commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh the Lounge Sidebar',
    execute: () => sidebar.refresh()
  });
  for (const command of [CommandIDs.open, CommandIDs.start, CommandIDs.refresh]) {
    palette?.addItem({ command, category: 'Lounge' });
  }
}

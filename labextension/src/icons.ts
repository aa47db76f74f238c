import { LabIcon } from '@jupyterlab/ui-components';

/** A sofa: the lounge. `jp-icon3` lets the theme colour it. */
const loungeSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M6 5h12a2 2 0 0 1 2 2v2.6a3 3 0 0 0-2.9 3V13H6.9v-.4a3 3 0 0 0-2.9-3V7a2 2 0 0 1 2-2z"/>
    <path d="M1.5 12.6a2 2 0 0 1 4 0V15h13v-2.4a2 2 0 0 1 4 0V18a1 1 0 0 1-1 1H20v1.5h-2V19H6v1.5H4V19H2.5a1 1 0 0 1-1-1z"/>
  </g>
</svg>`;

export const loungeIcon = new LabIcon({
  name: 'jupyter-lounge:lounge',
  svgstr: loungeSvg
});

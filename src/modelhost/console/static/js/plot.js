// Plots with uPlot (installed by scripts/setup.sh into /console/vendor/). Without it: a note.
import { h, replace } from "./dom.js";

const COLORS = ["#3b6fd8", "#e5484d", "#12a150", "#d9a400"];

export function plot(container, { title, labels, x, ys, width = 520, height = 220, time = true, bars = false }) {
  container.dataset.points = String(x.length);
  const U = window.uPlot;
  if (!U) {
    replace(container, h("p", { class: "muted" }, `${title}: plots unavailable (uPlot was not installed; run scripts/setup.sh with npm).`));
    return null;
  }
  const data = [x, ...ys];
  // a plot already there with the same series takes the new data (no flicker, no new canvas)
  if (container.uplot && container.uplot.series.length === ys.length + 1 && container.firstChild === container.uplot.root) {
    container.uplot.setData(data);
    return container.uplot;
  }
  replace(container);
  const series = [{}].concat(labels.map((label, i) => ({
    label,
    stroke: COLORS[i % COLORS.length],
    fill: bars ? COLORS[i % COLORS.length] + "55" : undefined,
    width: 2,
    points: { show: true, size: 6 },
    paths: bars && U.paths && U.paths.bars ? U.paths.bars({ size: [0.6 / labels.length, 60], align: i === 0 ? -1 : 1 }) : undefined,
  })));
  const axes = [{}, { size: 70, values: (u, values) => values.map((v) => (v == null ? "" : +v.toPrecision(3))) }];
  container.uplot = new U({ title, width, height, series, axes, scales: { x: { time } }, legend: { show: true } }, data, container);
  return container.uplot;
}

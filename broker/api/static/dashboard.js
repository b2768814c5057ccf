// Draws the dashboard's charts from the page's embedded JSON (Chart.js, shipped with the
// package: no CDN). Pages with unfinished jobs reload themselves every few seconds.
(function () {
  "use strict";
  const node = document.getElementById("chart-data");
  const data = node ? JSON.parse(node.textContent) : {};
  const palette = ["#3366cc", "#dc7633", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00", "#b82e2e"];
  const usd = (micros) => micros / 1e6;
  Chart.defaults.animation = false;

  function lines(canvas, labels, series) {
    const datasets = Object.keys(series).map((name, i) => ({
      label: name, data: series[name].map(usd), borderColor: palette[i % palette.length],
      backgroundColor: palette[i % palette.length], pointRadius: 0, tension: 0.1,
    }));
    return new Chart(canvas, {
      type: "line", data: { labels: labels, datasets: datasets },
      options: { scales: { y: { beginAtZero: true, title: { display: true, text: "USD" } } } },
    });
  }

  const draw = {
    "gauge": (canvas) => {
      const b = data.budgets[Number(canvas.dataset.key)];
      new Chart(canvas, {
        type: "doughnut",
        data: {
          labels: ["spent", "reserved", "left"],
          datasets: [{ data: [usd(b.spent), usd(b.reserved), usd(Math.max(b.left, 0))],
                       backgroundColor: [b.alert ? "#b3261e" : "#3366cc", "#f2b134", "#d9dee5"] }],
        },
        options: { plugins: { legend: { position: "bottom" } }, circumference: 270, rotation: -135 },
      });
    },
    "spend-team": (canvas) => lines(canvas, data.spend.labels, data.spend.by_team),
    "spend-provider": (canvas) => lines(canvas, data.spend.labels, data.spend.by_provider),
    "prices": (canvas) => {
      const p = data.prices[Number(canvas.dataset.key)];
      const dollars = (values) => values.map((v) => (v === null ? null : usd(v)));
      new Chart(canvas, {
        type: "bar",
        data: {
          labels: p.labels,
          datasets: [
            { label: "spot", data: dollars(p.spot), backgroundColor: "#3366cc" },
            { label: "on-demand", data: dollars(p.on_demand), backgroundColor: "#dc7633" },
          ],
        },
        options: { scales: { y: { beginAtZero: true, title: { display: true, text: "USD per GPU-hour" } } } },
      });
    },
    "timeline": (canvas) => {
      const rows = data.segments;
      new Chart(canvas, {
        type: "bar",
        data: {
          labels: rows.map((s, i) => `#${i + 1} ${s.where}`),
          datasets: [{
            label: "attempt", data: rows.map((s) => [s.start, Math.max(s.end, s.start + 0.01)]),
            backgroundColor: rows.map((s) => s.market === "spot" ? "#3366cc" : "#dc7633"),
            borderColor: rows.map((s) => s.reason === "preempted" ? "#b3261e" : "transparent"),
            borderWidth: 2, borderSkipped: false, maxBarThickness: 28,
          }],
        },
        options: {
          indexAxis: "y",
          plugins: { legend: { display: false } },
          scales: { x: { type: "linear", min: 0, title: { display: true, text: "hours since submission" } } },
        },
      });
    },
    "spend-curve": (canvas) => {
      new Chart(canvas, {
        type: "scatter",
        data: {
          datasets: [
            { label: "spend (USD)", data: data.spend_curve.map((p) => ({ x: p[0], y: usd(p[1]) })),
              showLine: true, borderColor: "#3366cc", backgroundColor: "#3366cc", yAxisID: "y" },
            { label: "checkpointed work", data: data.checkpoints.map((p) => ({ x: p[0], y: p[1] })),
              borderColor: "#109618", backgroundColor: "#109618", yAxisID: "work" },
          ],
        },
        options: {
          scales: {
            x: { type: "linear", min: 0, title: { display: true, text: "hours since submission" } },
            y: { beginAtZero: true, position: "left", title: { display: true, text: "USD" } },
            work: { beginAtZero: true, position: "right", grid: { drawOnChartArea: false } },
          },
        },
      });
    },
  };

  document.querySelectorAll("canvas[data-chart]").forEach((canvas) => draw[canvas.dataset.chart](canvas));

  const refresh = document.querySelector('meta[name="broker-refresh"]');
  if (refresh) {
    setTimeout(() => window.location.reload(), Number(refresh.content) * 1000);
  }
})();

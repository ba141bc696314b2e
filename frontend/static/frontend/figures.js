// Draw every figure whose spec the page embedded as JSON (<script type="application/json">).
(function () {
  "use strict";
  function wrap(text, width) {
    var lines = [], line = "";
    text.split(" ").forEach(function (word) {
      if (line && (line + " " + word).length > width) { lines.push(line); line = word; }
      else { line = line ? line + " " + word : word; }
    });
    lines.push(line);
    return lines.join("<br>");
  }
  function draw() {
    document.querySelectorAll("[data-figure]").forEach(function (div) {
      var spec = document.getElementById(div.dataset.figure);
      if (!spec) { return; }
      var fig = JSON.parse(spec.textContent);
      fig.layout.autosize = true;
      if (div.clientWidth < 600 && fig.layout.title && fig.layout.title.text) {
        // Phone width: Plotly does not wrap titles, so break them between words.
        fig.layout.title.text = wrap(fig.layout.title.text, Math.max(24, div.clientWidth / 9));
        fig.layout.title.font = {size: 12};
        fig.layout.margin = {l: 55, r: 10, t: 70, b: 60};
      }
      Plotly.newPlot(div, fig.data, fig.layout, {responsive: true, displaylogo: false})
        .then(function () { div.dataset.rendered = String(fig.data.length); });
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();

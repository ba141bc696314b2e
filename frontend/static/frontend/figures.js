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
  // Figures whose layout.meta.link names the same x quantity zoom together and show the
  // hover at the same x (e.g. the surface and the stability figure over N).
  var groups = {};
  function link(div, key) {
    var members = groups[key] = groups[key] || [];
    members.push(div);
    var busy = false;
    div.on("plotly_relayout", function (ev) {
      // A relayout this link made itself is not passed on again.
      if (busy || div.dataset.linking) { return; }
      var update = null;
      if (ev["xaxis.range[0]"] !== undefined) {
        update = {"xaxis.range": [ev["xaxis.range[0]"], ev["xaxis.range[1]"]]};
      } else if (ev["xaxis.range"]) {
        update = {"xaxis.range": ev["xaxis.range"].slice()};
      } else if (ev["xaxis.autorange"]) {
        update = {"xaxis.autorange": true};
      }
      if (!update) { return; }
      members.forEach(function (other) {
        if (other === div) { return; }
        other.dataset.linking = "1";
        Plotly.relayout(other, update).then(function () { delete other.dataset.linking; });
      });
    });
    div.on("plotly_hover", function (ev) {
      if (busy || !ev.points || !ev.points.length) { return; }
      busy = true;
      members.forEach(function (other) {
        if (other !== div && other.dataset.rendered) {
          try { Plotly.Fx.hover(other, {xval: ev.points[0].x}); } catch (e) { /* no point */ }
        }
      });
      busy = false;
    });
    div.on("plotly_unhover", function () {
      members.forEach(function (other) {
        if (other !== div && other.dataset.rendered) { Plotly.Fx.unhover(other); }
      });
    });
  }
  // A figure marked data-lazy (the 3-D scatter: WebGL, slow to build on big tables) is drawn
  // only when it comes near the viewport or its "draw" button is pressed, so it no longer
  // holds up the page's first interaction. Without IntersectionObserver it is drawn at once.
  function drawLazily(div) {
    var button = document.querySelector("[data-draw='" + div.id + "']");
    var done = false;
    function now() {
      if (done) { return; }
      done = true;
      if (observer) { observer.disconnect(); }
      if (button) { button.parentElement.hidden = true; }
      div.dataset.drawing = "1";
      drawOne(div);
    }
    var observer = null;
    if (button) { button.addEventListener("click", now); }
    if (!("IntersectionObserver" in window)) { now(); return; }
    observer = new IntersectionObserver(function (entries) {
      if (entries.some(function (e) { return e.isIntersecting; })) { now(); }
    }, {rootMargin: "200px 0px"});
    observer.observe(div);
  }
  function draw() {
    document.querySelectorAll("[data-figure]").forEach(function (div) {
      if (div.hasAttribute("data-lazy")) { drawLazily(div); } else { drawOne(div); }
    });
  }
  function drawOne(div) {
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
      .then(function () {
        var key = fig.layout.meta && fig.layout.meta.link;
        if (key) { link(div, key); }
        div.dataset.rendered = String(fig.data.length);
      });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();

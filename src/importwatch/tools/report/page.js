"use strict";
// importwatch report --format html: draws each process's threads from the JSON blob on a canvas.
// Rows (see page.py): begin (us after the previous row's begin) and length as drawn, depth, kind,
// name, flags, error, measured duration and self time. Nothing from the log is ever parsed as HTML: it reaches the page as text only.
(function () {
  var ROW = 9, UNFINISHED = 1, FAILED = 2, STALLED = 4;
  var KINDS = ["import", "native load", "phase", "blocking step"];
  var COLORS = ["#3b76d6", "#e08a1e", "#2e9e6a", "#8a5cc7"];
  var LIGHT = ["#9dbbeb", "#f0c48e", "#96cfb4", "#c4ade3"];
  var SHADE = "#2f64bd";  // every other import by name, so that neighbours read as two bars
  var FAILED_COLOR = "#98a2b3", RED = "#d92d20";
  var AXIS = 26, LANE_HEAD = 20, ROW_H = 17, LANE_GAP = 8, MAX_HEIGHT = 16000;
  var root = document.documentElement;
  var drawn = 0;

  function fail(error) {
    root.setAttribute("data-error", String((error && error.message) || error));
    var status = document.getElementById("status");
    if (status) status.textContent = "The drawing failed: " + root.getAttribute("data-error");
  }
  window.addEventListener("error", function (event) { fail(event.message); });

  function ms(us) {
    var value = us / 1000;
    if (value >= 1000) return (value / 1000).toFixed(3) + " s";
    return value.toFixed(value >= 100 ? 1 : 3) + " ms";
  }

  function clockPlus(clock, us) {
    // "HH:MM:SS.mmm" plus US microseconds, as a clock again (the log's time of day).
    var parts = /^(\d\d):(\d\d):(\d\d)\.(\d\d\d)$/.exec(clock || "");
    if (!parts) return "";
    var total = ((+parts[1] * 60 + +parts[2]) * 60 + +parts[3]) * 1000 + +parts[4] + us / 1000;
    total = ((total % 86400000) + 86400000) % 86400000;
    var pad = function (n, w) { return String(Math.floor(n)).padStart(w, "0"); };
    return pad(total / 3600000, 2) + ":" + pad((total / 60000) % 60, 2) + ":" + pad((total / 1000) % 60, 2) +
      "." + pad(total % 1000, 3);
  }

  function niceStep(span, pixels) {
    // A tick every 1, 2 or 5 times a power of ten, about every 110 pixels.
    var raw = span / Math.max(pixels / 110, 1), power = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * power >= raw) return steps[i] * power;
    return 10 * power;
  }

  // One thread's rows decoded: absolute begins, and per depth the row numbers in order of begin.
  function decode(thread) {
    var rows = thread.rows, count = rows.length / ROW;
    var begin = new Float64Array(count), end = new Float64Array(count);
    var byDepth = [];
    for (var d = 0; d < thread.depth; d++) byDepth.push([]);
    var at = 0;
    for (var i = 0; i < count; i++) {
      at += rows[i * ROW];
      begin[i] = at;
      end[i] = at + rows[i * ROW + 1];
      byDepth[rows[i * ROW + 2]].push(i);
    }
    return { name: thread.name, rows: rows, count: count, begin: begin, end: end, byDepth: byDepth, top: 0 };
  }

  function View(element, process, strings) {
    this.element = element;
    this.process = process;
    this.strings = strings;
    this.canvas = element.querySelector("canvas");
    this.tip = element.querySelector(".tip");
    this.details = element.querySelector(".details");
    this.lanes = process.threads.map(decode);
    var y = AXIS, cut = false;
    this.lanes.forEach(function (lane) {
      lane.top = y;
      var rows = lane.byDepth.length;
      if (y + LANE_HEAD + rows * ROW_H > MAX_HEIGHT) { rows = Math.max(0, Math.floor((MAX_HEIGHT - y - LANE_HEAD) / ROW_H)); cut = true; }
      lane.shownDepth = rows;
      y += LANE_HEAD + rows * ROW_H + LANE_GAP;
    });
    this.height = Math.min(y, MAX_HEIGHT + LANE_HEAD);
    this.cut = cut;
    this.span = Math.max(process.span, 1);
    this.reset();
    this.selected = null;
    this.listen();
    this.draw();
  }

  View.prototype.reset = function () { this.t0 = -this.span * 0.005; this.t1 = this.span * 1.01; };

  View.prototype.size = function () {
    var width = this.canvas.parentNode.clientWidth || 800, ratio = window.devicePixelRatio || 1;
    if (this.width !== width || this.ratio !== ratio) {
      this.width = width;
      this.ratio = ratio;
      this.canvas.width = Math.round(width * ratio);
      this.canvas.height = Math.round(this.height * ratio);
      this.canvas.style.height = this.height + "px";
    }
  };

  View.prototype.x = function (t) { return (t - this.t0) * this.width / (this.t1 - this.t0); };
  View.prototype.t = function (x) { return this.t0 + x * (this.t1 - this.t0) / this.width; };

  View.prototype.draw = function () {
    this.size();
    var ctx = this.canvas.getContext("2d"), width = this.width, self = this;
    ctx.setTransform(this.ratio, 0, 0, this.ratio, 0, 0);
    ctx.clearRect(0, 0, width, this.height);
    ctx.font = "11.5px system-ui, -apple-system, 'Segoe UI', Roboto, 'Liberation Sans', sans-serif";
    ctx.textBaseline = "middle";
    this.drawAxis(ctx);
    this.lanes.forEach(function (lane) { self.drawLane(ctx, lane); });
    this.drawMarks(ctx);
    if (this.cut) {
      ctx.fillStyle = "#667085";
      ctx.fillText("(deeper levels and further threads are cut off here)", 8, this.height - 8);
    }
  };

  View.prototype.drawAxis = function (ctx) {
    var span = this.t1 - this.t0, step = niceStep(span, this.width);
    ctx.fillStyle = "#f9fafb";
    ctx.fillRect(0, 0, this.width, AXIS - 4);
    ctx.strokeStyle = "#eaecf0";
    ctx.fillStyle = "#667085";
    ctx.lineWidth = 1;
    for (var t = Math.ceil(this.t0 / step) * step; t <= this.t1; t += step) {
      var x = Math.round(this.x(t)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x, AXIS - 8);
      ctx.lineTo(x, this.height);
      ctx.stroke();
      ctx.fillText(ms(t).replace(/\.?0+ (m?s)$/, " $1"), x + 3, 10);
    }
  };

  View.prototype.drawLane = function (ctx, lane) {
    var rows = lane.rows, strings = this.strings, width = this.width;
    var scale = width / (this.t1 - this.t0), t0 = this.t0, t1 = this.t1;
    ctx.fillStyle = "#f2f4f7";
    ctx.fillRect(0, lane.top, width, LANE_HEAD - 2);
    ctx.fillStyle = "#1d2430";
    ctx.font = "600 12px system-ui, -apple-system, 'Segoe UI', Roboto, 'Liberation Sans', sans-serif";
    ctx.fillText("thread " + lane.name + "  (" + lane.count + " steps)", 6, lane.top + LANE_HEAD / 2);
    ctx.font = "11.5px system-ui, -apple-system, 'Segoe UI', Roboto, 'Liberation Sans', sans-serif";
    for (var depth = 0; depth < lane.shownDepth; depth++) {
      var list = lane.byDepth[depth], y = lane.top + LANE_HEAD + depth * ROW_H;
      // Rows of one depth never overlap: their ends are in order too, so the first visible is found by halves.
      var low = 0, high = list.length;
      while (low < high) {
        var mid = (low + high) >> 1;
        if (lane.end[list[mid]] < t0) low = mid + 1; else high = mid;
      }
      var lastPixel = -1;
      for (var k = low; k < list.length; k++) {
        var i = list[k], b = lane.begin[i];
        if (b > t1) break;
        var x0 = (b - t0) * scale, x1 = (lane.end[i] - t0) * scale;
        var flags = rows[i * ROW + 5], kind = rows[i * ROW + 3];
        if (x1 - x0 < 2) {
          // Steps thinner than a pixel or two: one sliver per pixel, so a million of them cost a row of pixels.
          var pixel = Math.floor(x0);
          if (pixel <= lastPixel && !(flags & STALLED)) continue;
          lastPixel = Math.floor(x1) + 1;
          ctx.fillStyle = flags & STALLED ? RED : flags & FAILED ? FAILED_COLOR : COLORS[kind];
          ctx.fillRect(pixel, y + 1, Math.max(x1 - x0, 1), ROW_H - 2);
          continue;
        }
        var left = Math.max(x0, -2), right = Math.min(x1, width + 2);
        ctx.fillStyle = flags & FAILED ? FAILED_COLOR : flags & STALLED ? LIGHT[kind] :
          kind === 0 && rows[i * ROW + 4] & 1 ? SHADE : COLORS[kind];
        ctx.fillRect(left, y + 1, Math.max(right - left - 1, 1), ROW_H - 2);
        if (flags & STALLED) {
          ctx.strokeStyle = RED;
          ctx.lineWidth = 2;
          ctx.strokeRect(left + 1, y + 2, Math.max(right - left - 3, 1), ROW_H - 4);
        }
        if (this.selected && this.selected.lane === lane && this.selected.row === i) {
          ctx.strokeStyle = "#101828";
          ctx.lineWidth = 2;
          ctx.strokeRect(left + 1, y + 1, Math.max(right - left - 3, 1), ROW_H - 2);
        }
        if (right - left > 36) {
          var label = (kind === 1 ? "dlopen " + basename(strings[rows[i * ROW + 4]]) : strings[rows[i * ROW + 4]]);
          if (flags & UNFINISHED) label += " (never ended)";
          ctx.fillStyle = flags & STALLED || flags & FAILED ? "#101828" : "#fff";
          ctx.save();
          ctx.beginPath();
          ctx.rect(left, y, right - left - 4, ROW_H);
          ctx.clip();
          ctx.fillText(label, Math.max(left, 0) + 4, y + ROW_H / 2 + 0.5);
          ctx.restore();
        }
      }
    }
  };

  View.prototype.drawMarks = function (ctx) {
    var self = this;
    this.process.marks.forEach(function (mark) {
      var x = Math.round(self.x(mark[0])) + 0.5;
      if (x < 0 || x > self.width) return;
      var stall = mark[1] === "stall";
      ctx.strokeStyle = stall ? RED : "#2e9e6a";
      ctx.setLineDash([4, 3]);
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(x, 12);
      ctx.lineTo(x, self.height);
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = stall ? RED : "#2e9e6a";
      ctx.fillText(stall ? "STALL " + mark[2] : mark[2], x + 3, AXIS - 9);
    });
  };

  function basename(path) { var cut = path.lastIndexOf("/"); return cut < 0 ? path : path.slice(cut + 1); }

  View.prototype.hit = function (event) {
    var box = this.canvas.getBoundingClientRect(), x = event.clientX - box.left, y = event.clientY - box.top;
    var t = this.t(x), slack = 3 * (this.t1 - this.t0) / this.width;
    for (var n = 0; n < this.lanes.length; n++) {
      var lane = this.lanes[n], depth = Math.floor((y - lane.top - LANE_HEAD) / ROW_H);
      if (depth < 0 || depth >= lane.shownDepth) continue;
      var list = lane.byDepth[depth], low = 0, high = list.length;
      while (low < high) {
        var mid = (low + high) >> 1;
        if (lane.end[list[mid]] + slack < t) low = mid + 1; else high = mid;
      }
      if (low < list.length && lane.begin[list[low]] - slack <= t) return { lane: lane, row: list[low], x: x, y: y };
    }
    return null;
  };

  // The step's text: name, kind, thread, start, duration, path, error, chain; for the tip and the panel.
  View.prototype.describe = function (found) {
    var lane = found.lane, rows = lane.rows, i = found.row, strings = this.strings;
    var kind = rows[i * ROW + 3], flags = rows[i * ROW + 5], depth = rows[i * ROW + 2];
    var name = strings[rows[i * ROW + 4]], error = rows[i * ROW + 6];
    var lines = [(kind === 1 ? "dlopen " + basename(name) : name) + "   (" + KINDS[kind] + ")"];
    lines.push("thread:   " + lane.name);
    lines.push("start:    " + clockPlus(this.process.clock, lane.begin[i]) + "  (+" + ms(lane.begin[i]) + " after the process's first line)");
    lines.push("duration: " + ms(rows[i * ROW + 7]) + (kind === 0 ? "  (self " + ms(rows[i * ROW + 8]) + ")" : "") +
      (flags & UNFINISHED ? ", until the log ends" : ""));
    var path = kind === 1 ? name : "";
    if (kind === 0) {
      // Its own native load, if it had one: a row one level deeper within its time.
      for (var j = i + 1; j < lane.count && lane.begin[j] <= lane.end[i]; j++) {
        if (rows[j * ROW + 2] <= depth) break;
        if (rows[j * ROW + 2] === depth + 1 && rows[j * ROW + 3] === 1) { path = strings[rows[j * ROW + 4]]; break; }
      }
    }
    if (path) lines.push("path:     " + path);
    if (error >= 0) lines.push("error:    " + strings[error]);
    if (flags & UNFINISHED) lines.push("state:    never ended: in flight when the log ends");
    else if (flags & STALLED) lines.push("state:    in flight at a stall report, ended later");
    var chain = [], want = depth - 1;
    for (var p = i - 1; p >= 0 && want >= 0; p--) {
      if (rows[p * ROW + 2] === want) {
        chain.unshift(rows[p * ROW + 3] === 1 ? "dlopen " + basename(strings[rows[p * ROW + 4]]) : strings[rows[p * ROW + 4]]);
        want--;
      }
    }
    if (chain.length) lines.push("inside:   " + chain.join(" > "));
    return lines.join("\n");
  };

  View.prototype.listen = function () {
    var self = this, canvas = this.canvas, drag = null;
    canvas.addEventListener("wheel", function (event) {
      event.preventDefault();
      var box = canvas.getBoundingClientRect(), at = self.t(event.clientX - box.left);
      var factor = Math.exp(Math.max(-1, Math.min(1, event.deltaY * 0.002)));
      var span = Math.max((self.t1 - self.t0) * factor, 1);
      self.t0 = at - (at - self.t0) * span / (self.t1 - self.t0);
      self.t1 = self.t0 + span;
      self.draw();
    }, { passive: false });
    canvas.addEventListener("mousedown", function (event) { drag = { x: event.clientX, t0: self.t0, t1: self.t1, moved: false }; });
    window.addEventListener("mouseup", function () { setTimeout(function () { drag = null; }, 0); });
    canvas.addEventListener("mousemove", function (event) {
      if (drag && event.buttons & 1) {
        var dx = event.clientX - drag.x;
        if (Math.abs(dx) > 3) drag.moved = true;
        var shift = dx * (drag.t1 - drag.t0) / self.width;
        self.t0 = drag.t0 - shift;
        self.t1 = drag.t1 - shift;
        self.tip.hidden = true;
        self.draw();
        return;
      }
      var found = self.hit(event);
      if (!found) { self.tip.hidden = true; return; }
      self.tip.textContent = self.describe(found);
      self.tip.hidden = false;
      var left = found.x + 14, top = found.y + 14;
      if (left + self.tip.offsetWidth > self.width) left = Math.max(found.x - self.tip.offsetWidth - 8, 0);
      self.tip.style.left = left + "px";
      self.tip.style.top = top + "px";
    });
    canvas.addEventListener("mouseleave", function () { self.tip.hidden = true; });
    canvas.addEventListener("click", function (event) {
      if (drag && drag.moved) return;
      var found = self.hit(event);
      self.selected = found;
      self.details.textContent = found ? self.describe(found) : "Click a bar for its details.";
      self.draw();
    });
    canvas.addEventListener("dblclick", function (event) {
      var found = self.hit(event);
      if (found) {
        var b = found.lane.begin[found.row], e = found.lane.end[found.row], pad = Math.max((e - b) * 0.05, 1);
        self.t0 = b - pad;
        self.t1 = e + pad;
      } else {
        self.reset();
      }
      self.draw();
    });
    window.addEventListener("resize", function () { self.draw(); });
  };

  function main() {
    var data = JSON.parse(document.getElementById("data").textContent);
    var views = {};
    var total = 0;
    data.processes.forEach(function (process) {
      process.threads.forEach(function (thread) { total += thread.rows.length / ROW; });
    });
    function open(section) {
      var number = section.getAttribute("data-process");
      if (views[number] || !section.open) return;
      var process = data.processes[+number];
      views[number] = new View(section.querySelector(".view"), process, data.strings);
      process.threads.forEach(function (thread) { drawn += thread.rows.length / ROW; });
    }
    var sections = document.querySelectorAll("details.process");
    Array.prototype.forEach.call(sections, function (section) {
      open(section);
      section.addEventListener("toggle", function () {
        try { open(section); } catch (error) { fail(error); }
      });
    });
    root.setAttribute("data-steps", String(total));
    root.setAttribute("data-drawn", String(drawn));
    document.getElementById("status").textContent = total + " steps in " + data.processes.length +
      (data.processes.length === 1 ? " process" : " processes") + "; " + drawn + " drawn in the open sections.";
  }

  try { main(); } catch (error) { fail(error); }
})();

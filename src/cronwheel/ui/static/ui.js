// cronwheel dashboard: follows a running run's log. Reads the lines after the last
// cursor from the page's own JSON endpoint (under the session) once a second, until
// the run is over; then reloads the page once, to show its outcome.
(function () {
  "use strict";
  var log = document.getElementById("log");
  if (!log || log.dataset.live !== "yes") { return; }
  var run = log.dataset.run;
  var cursor = log.dataset.cursor || "";
  var empty = document.getElementById("log-empty");

  function line(l) {
    var span = document.createElement("span");
    span.className = "log-line lvl-" + l.level;
    var ts = document.createElement("span"); ts.className = "ts"; ts.title = l.ts;
    ts.textContent = String(l.ts).slice(11, 23);
    var att = document.createElement("span"); att.className = "att"; att.textContent = "#" + l.attempt;
    var lvl = document.createElement("span"); lvl.className = "lvl"; lvl.textContent = l.level;
    span.append(ts, " ", att, " ", lvl, " " + l.message + "\n");
    return span;
  }

  function poll() {
    var url = "/ui/runs/" + encodeURIComponent(run) + "/logs.json" +
      (cursor ? "?cursor=" + encodeURIComponent(cursor) : "");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
      .then(function (page) {
        var atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        page.lines.forEach(function (l) { log.appendChild(line(l)); });
        if (page.lines.length && empty) { empty.remove(); empty = null; }
        if (atBottom) { log.scrollTop = log.scrollHeight; }
        cursor = page.next_cursor || page.end_cursor || cursor;
        if (page.next_cursor) { setTimeout(poll, 0); return; }
        if (page.live) { setTimeout(poll, 1000); return; }
        window.location.reload();
      })
      .catch(function () { setTimeout(poll, 3000); });
  }
  log.scrollTop = log.scrollHeight;
  setTimeout(poll, 1000);
})();

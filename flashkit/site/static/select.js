// The install selector. It computes nothing: every answer was stored by `flashkit site`, which ran
// `flashkit resolve`'s own code for each choice (flashkit/site/selector.py says how the data is laid out,
// and does in Python what this does, for the page as written and for the tests). This looks the choice up,
// shows its lines, always as text (textContent), never as markup, and keeps the choice in the URL.
"use strict";
(function () {
  var data = JSON.parse(document.getElementById("fk-answers").textContent);
  var selects = Array.prototype.slice.call(document.querySelectorAll("select[data-fk-select]"));
  var result = document.getElementById("fk-result");
  var nearGo = document.getElementById("fk-near-go");
  var nearChoice = null;

  function flatOf(idx) {
    var flat = 0;
    idx.forEach(function (i, k) { flat = flat * data.selects[k].length + i; });
    return flat;
  }

  function indicesOf(flat) {
    var idx = [];
    for (var k = data.selects.length - 1; k >= 0; k--) {
      idx.unshift(flat % data.selects[k].length);
      flat = Math.floor(flat / data.selects[k].length);
    }
    return idx;
  }

  function current() {
    return selects.map(function (s) { return Number(s.value); });
  }

  // A stored line as resolve printed it: the markers' values put back in the reverse order they went in.
  function text(refs, choice) {
    var marks = [[data.mark, choice.map(function (o) { return o.phrase; }).join(", ")]];
    choice.forEach(function (o, k) { if (data.part_marks[k] && o.value) { marks.push([data.part_marks[k], o.value]); } });
    return refs.map(function (i) {
      var line = data.lines[i];
      for (var m = marks.length - 1; m >= 0; m--) { line = line.split(marks[m][0]).join(marks[m][1]); }
      return line;
    });
  }

  // An option that, the other selects as they are, fits nothing: marked, still selectable (to read why).
  // The chosen one is not marked: the answer says whether the choice fits.
  function grey(idx) {
    selects.forEach(function (s, k) {
      Array.prototype.forEach.call(s.options, function (opt, i) {
        var other = idx.slice();
        other[k] = i;
        var nofit = i !== idx[k] && data.answers[data.pick[flatOf(other)]][0] === data.nofit;
        opt.className = nofit ? "nofit" : "";
        opt.textContent = data.selects[k][i].label + (nofit ? data.nofit_suffix : "");
      });
    });
  }

  function writeUrl(choice) {
    var params = new URLSearchParams();
    choice.forEach(function (o) { if (o.param) { params.set(o.param[0], o.param[1]); } });
    try {
      history.replaceState(null, "", "?" + params.toString() + location.hash);
    } catch (e) {
      // A browser that refuses to change a file:// URL: the page works, the URL just stays as it was.
    }
  }

  // The choice the URL names; a select the URL does not name, or names with a value that is not one of its
  // options, keeps the page's own default (for the ABI that is "either", which has no parameter).
  function readUrl() {
    var params = new URLSearchParams(location.search);
    selects.forEach(function (s, k) {
      data.selects[k].forEach(function (o, i) {
        if (o.param && params.get(o.param[0]) === o.param[1]) { s.value = String(i); }
      });
    });
  }

  // Shows the selected choice's answer; ``keep`` (a user's change) also writes the choice into the URL.
  function show(keep) {
    var idx = current();
    var answer = data.answers[data.pick[flatOf(idx)]];
    var choice = idx.map(function (i, k) { return data.selects[k][i]; });
    var argv = ["flashkit", "resolve"];
    choice.forEach(function (o) { argv = argv.concat(o.argv); });
    var blocks = answer[2].map(function (b) { return text(data.blocks[b], choice); });
    document.getElementById("fk-cmd").textContent = argv.join(" ");
    document.getElementById("fk-out").textContent = text(answer[1], choice).join("\n");
    document.getElementById("fk-err").textContent = [].concat.apply([], blocks).join("\n");
    document.getElementById("fk-verdict").textContent = data.exits[String(answer[0])] || "resolve exits " + answer[0] + ".";
    document.getElementById("fk-install").hidden = answer[1].length === 0;
    document.getElementById("fk-near").hidden = answer[3] < 0;
    document.getElementById("fk-near-text").textContent = answer[3] < 0 ? "" : blocks[answer[3]].join("\n");
    nearChoice = answer[4] < 0 ? null : indicesOf(answer[4]);
    nearGo.hidden = nearChoice === null;
    result.setAttribute("data-exit", String(answer[0]));
    grey(idx);
    if (keep) { writeUrl(choice); }
  }

  function copied(button, ok) {
    button.textContent = ok ? "Copied" : "Selected: press Ctrl+C";
    button.setAttribute("data-copied", ok ? "yes" : "selected");
    setTimeout(function () { button.textContent = "Copy"; button.removeAttribute("data-copied"); }, 2000);
  }

  // The clipboard API where the page may use it (HTTPS, localhost); else the text is selected and the
  // older copy command tried, and the button says which happened.
  function copy(button) {
    var source = document.getElementById(button.getAttribute("data-copy"));
    var value = source.textContent;
    function fallback() {
      var range = document.createRange();
      range.selectNodeContents(source);
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      copied(button, ok);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(value).then(function () { copied(button, true); }, fallback);
    } else {
      fallback();
    }
  }

  Array.prototype.forEach.call(document.querySelectorAll("button.copy"), function (b) {
    b.hidden = false;
    b.addEventListener("click", function () { copy(b); });
  });
  nearGo.addEventListener("click", function () {
    if (nearChoice === null) { return; }
    selects.forEach(function (s, k) { s.value = String(nearChoice[k]); });
    show(true);
    document.getElementById("fk-verdict").focus();
  });
  selects.forEach(function (s) { s.addEventListener("change", function () { show(true); }); });
  readUrl();
  document.getElementById("fk-fields").disabled = false;
  show(false);
})();

// The install selector. It computes nothing: every answer was stored by `flashkit site`, which ran
// `flashkit resolve`'s own code for each choice. This only looks the choice up and shows its lines,
// always as text (textContent), never as markup.
"use strict";
(function () {
  var data = JSON.parse(document.getElementById("fk-answers").textContent);
  var selects = Array.prototype.slice.call(document.querySelectorAll("select[data-fk-select]"));
  var result = document.getElementById("fk-result");

  function chosen() {
    return selects.map(function (s, k) { return data.selects[k][Number(s.value)]; });
  }

  function lines(refs, description) {
    return refs.map(function (i) { return data.lines[i].split(data.mark).join(description); }).join("\n");
  }

  function show() {
    var flat = 0;
    selects.forEach(function (s, k) { flat = flat * data.selects[k].length + Number(s.value); });
    var answer = data.answers[data.pick[flat]];
    var choice = chosen();
    var description = choice.map(function (o) { return o.phrase; }).join(", ");
    var argv = ["flashkit", "resolve"];
    choice.forEach(function (o) { argv = argv.concat(o.argv); });
    document.getElementById("fk-cmd").textContent = argv.join(" ");
    document.getElementById("fk-out").textContent = lines(answer[1], description);
    document.getElementById("fk-err").textContent = lines(answer[2], description);
    document.getElementById("fk-verdict").textContent = data.exits[String(answer[0])] || "exit " + answer[0];
    document.getElementById("fk-install").hidden = answer[1].length === 0;
    result.setAttribute("data-exit", String(answer[0]));
  }

  selects.forEach(function (s) { s.addEventListener("change", show); });
  show();
})();

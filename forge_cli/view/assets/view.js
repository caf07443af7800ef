// forge view: search, filter and fold a rollout's call tree (or filter the index table).
// Matches are highlighted with DOM text nodes only: recorded text is never parsed as HTML.
"use strict";
(function () {
  const count = document.getElementById("match-count");

  function openAncestors(el) {
    let d = el.closest("details");
    while (d) {
      d.open = true;
      d = d.parentElement ? d.parentElement.closest("details") : null;
    }
  }

  function unmark(root) {
    for (const m of Array.from(root.querySelectorAll("mark.hit"))) {
      const parent = m.parentNode;
      parent.replaceChild(document.createTextNode(m.textContent), m);
      parent.normalize();
    }
  }

  // Wrap each case-insensitive occurrence of q (lower case) in the text under el.
  function mark(el, q) {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    const nodes = [];
    while (walker.nextNode()) nodes.push(walker.currentNode);
    let hits = 0;
    for (const node of nodes) {
      const text = node.nodeValue;
      const lower = text.toLowerCase();
      let i = lower.indexOf(q);
      if (i < 0) continue;
      if (lower.length !== text.length) { // case folding changed offsets: count, do not split
        hits += 1;
        continue;
      }
      const frag = document.createDocumentFragment();
      let last = 0;
      while (i >= 0) {
        frag.append(text.slice(last, i));
        const m = document.createElement("mark");
        m.className = "hit";
        m.textContent = text.slice(i, i + q.length);
        frag.append(m);
        hits += 1;
        last = i + q.length;
        i = lower.indexOf(q, last);
      }
      frag.append(text.slice(last));
      node.parentNode.replaceChild(frag, node);
    }
    return hits;
  }

  function debounce(fn) {
    let timer = null;
    return function () {
      clearTimeout(timer);
      timer = setTimeout(fn, 120);
    };
  }

  function focusOnSlash(input) {
    document.addEventListener("keydown", function (ev) {
      if (ev.key === "/" && document.activeElement !== input) {
        ev.preventDefault();
        input.focus();
      }
    });
  }

  // ---------------------------------------------------------------- rollout page
  const tree = document.getElementById("tree");
  if (tree) {
    const calls = Array.from(tree.querySelectorAll("details.call"));
    const box = document.getElementById("search");
    const only = document.getElementById("only-matches");

    // A call's own parts: its head and messages, not the calls that hang from it.
    const ownParts = (call) =>
      Array.from(call.children).filter((el) => !el.classList.contains("branches"));

    function search() {
      const q = box.value.trim().toLowerCase();
      unmark(tree);
      const keep = new Set();
      let matched = 0;
      for (const call of calls) {
        call.classList.remove("match", "filtered-out");
        if (!q) continue;
        let hits = 0;
        for (const part of ownParts(call)) hits += mark(part, q);
        if (hits > 0) {
          matched += 1;
          call.classList.add("match");
          for (let a = call; a; a = a.parentElement && a.parentElement.closest("details.call")) {
            keep.add(a);
          }
        }
      }
      if (!q) {
        count.textContent = "";
        return;
      }
      for (const m of Array.from(tree.querySelectorAll("mark.hit"))) openAncestors(m);
      if (only.checked) {
        for (const call of calls) if (!keep.has(call)) call.classList.add("filtered-out");
      }
      count.textContent = matched + " of " + calls.length + " calls match";
    }

    box.addEventListener("input", debounce(search));
    only.addEventListener("change", search);
    document.getElementById("open-all").addEventListener("click", function () {
      for (const d of Array.from(tree.querySelectorAll("details"))) d.open = true;
    });
    document.getElementById("close-all").addEventListener("click", function () {
      for (const d of Array.from(tree.querySelectorAll("details:not(.call)"))) d.open = false;
    });
    focusOnSlash(box);
    // A link to #call-N opens that call.
    if (location.hash) {
      const target = document.getElementById(location.hash.slice(1));
      if (target) openAncestors(target);
    }
  }

  // ---------------------------------------------------------------- index page
  const table = document.getElementById("rollouts");
  if (table) {
    const filter = document.getElementById("filter");
    const rows = Array.from(table.tBodies[0].rows);
    filter.addEventListener("input", debounce(function () {
      const q = filter.value.trim().toLowerCase();
      let shown = 0;
      for (const row of rows) {
        const hit = !q || row.textContent.toLowerCase().includes(q);
        row.classList.toggle("filtered-out", !hit);
        shown += hit ? 1 : 0;
      }
      count.textContent = q ? shown + " of " + rows.length + " rollouts" : "";
    }));
    focusOnSlash(filter);
  }

  document.documentElement.dataset.viewer = "ready";
})();

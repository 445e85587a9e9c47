// Allocation requests on the pages (services/api/routes_requests.py): on a project's page its lead
// asks for GPU-hours, an extension or a time-slice window and sees the decisions; on the overview
// admins approve (possibly another amount) or deny the open ones. The session cookie (SameSite=
// Strict) is what authenticates the POSTs, so no other site can make them.
"use strict";

(function () {
  const A = window.Allmende;

  // One Idempotency-Key per submission: a double click asks once.
  A.postJSON = async (path, body, key) => {
    const headers = { Accept: "application/json", "Content-Type": "application/json" };
    if (key) headers["Idempotency-Key"] = key;
    const response = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers,
      body: JSON.stringify(body),
    });
    if (response.status === 401) {
      window.location.assign("/ui/signin");
      throw new Error("signed out");
    }
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) {
      const detail = answer.detail;
      const text = typeof detail === "string" ? detail : detail && detail.detail ? detail.detail : null;
      throw new Error(text || (Array.isArray(detail) ? detail.map((d) => d.msg).join("; ") : response.statusText));
    }
    return answer;
  };

  const what = (r) => {
    if (r.kind === "gpu-hours") {
      const granted = r.granted_gpu_hours !== null ? ` (granted ${A.fmt.hours(r.granted_gpu_hours)})` : "";
      return `${A.fmt.hours(r.gpu_hours)} GPU-h in ${r.period}${r.cluster ? ` on ${r.cluster}` : ""}${granted}`;
    }
    if (r.kind === "extension") return `${r.allocation_id} until ${new Date(r.extend_to * 1000).toISOString().slice(0, 10)}`;
    const w = r.window || {};
    const when = w.kind === "fixed" ? `${new Date(w.start * 1000).toISOString().slice(0, 16)}Z, ${Math.round((w.end - w.start) / 3600)} h` : "weekly";
    return `${r.gpus} GPUs of ${r.cluster}, ${when}`;
  };
  const rows = (list) =>
    list.map((r) => ({
      ...r,
      asked: new Date(r.asked_at * 1000).toISOString().slice(0, 16).replace("T", " "),
      what: what(r),
    }));
  const COLUMNS = [
    { key: "asked", label: "Asked (UTC)" },
    { key: "asked_by", label: "By" },
    { key: "kind", label: "Kind" },
    { key: "what", label: "What" },
    { key: "reason", label: "Why" },
    { key: "status", label: "Status" },
    { key: "decided_by", label: "Decided by" },
    { key: "comment", label: "Comment" },
  ];

  // The project page: the project's requests, and the form its lead asks with.
  A.projectRequests = (project) =>
    A.loading("requests", "#requests", async () => {
      const path = `/v1/projects/${encodeURIComponent(project)}/requests`;
      const list = await A.getJSON(path, { period: null });
      A.table("#requests .body", rows(list), COLUMNS, { empty: "No requests yet." });
      const form = A.$("#request-form");
      if (!form || form.dataset.bound) return;
      form.dataset.bound = "true";
      const kind = form.elements.kind;
      const show = () => {
        for (const part of form.querySelectorAll("[data-kind]")) part.hidden = part.dataset.kind !== kind.value;
      };
      kind.addEventListener("change", show);
      show();
      let key = crypto.randomUUID();
      form.addEventListener("input", () => (key = crypto.randomUUID())); // another request
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        const f = form.elements;
        const body = { kind: kind.value, reason: f.reason.value };
        if (kind.value === "gpu-hours") Object.assign(body, { gpu_hours: f.gpu_hours.value, period: f.period.value || undefined });
        if (kind.value === "extension") Object.assign(body, { allocation_id: f.allocation_id.value, extend_to: `${f.extend_to.value}T00:00:00Z` });
        if (kind.value === "time-slice") {
          const start = Date.parse(`${f.start.value}Z`) / 1000;
          Object.assign(body, { cluster: f.cluster.value, gpus: Number(f.gpus.value), window: { kind: "fixed", start, end: start + 3600 * Number(f.hours.value) } });
        }
        const status = A.$("#request-status");
        try {
          await A.postJSON(path, body, key);
          status.textContent = "Asked. An admin will decide.";
          status.className = "ok";
          form.reset();
          show();
          await A.projectRequests(project);
        } catch (error) {
          status.textContent = error.message;
          status.className = "error";
        }
      });
    });

  // The overview (admins): every open request, with the amount to grant, a comment and the decision.
  A.openRequests = () =>
    A.loading("open-requests", "#open-requests", async () => {
      const list = rows(await A.getJSON("/v1/admin/requests", { period: null }));
      const box = A.$("#open-requests .body");
      A.table(box, list, [{ key: "project", label: "Project", link: (r) => `/ui/projects/${encodeURIComponent(r.project)}` }, ...COLUMNS.slice(0, 5)], { empty: "No open requests." });
      const table = box.querySelector("table");
      if (!table) return;
      table.tHead.rows[0].appendChild(document.createElement("th")).textContent = "Decision";
      [...table.tBodies[0].rows].forEach((tr, i) => {
        const r = list[i];
        const td = tr.insertCell();
        td.className = "decide";
        td.dataset.request = r.request_id;
        td.innerHTML = '<input name="gpu_hours" size="7" aria-label="GPU-hours to grant"> <input name="comment" placeholder="comment" aria-label="comment"> <button data-decision="approve">Approve</button> <button data-decision="deny">Deny</button> <span class="status"></span>';
        const amount = td.querySelector("[name=gpu_hours]");
        if (r.kind === "gpu-hours") amount.value = r.gpu_hours;
        else amount.hidden = true;
        for (const button of td.querySelectorAll("button")) {
          button.addEventListener("click", async () => {
            const body = { decision: button.dataset.decision, comment: td.querySelector("[name=comment]").value };
            if (body.decision === "approve" && r.kind === "gpu-hours") body.gpu_hours = amount.value;
            try {
              await A.postJSON(`/v1/admin/requests/${encodeURIComponent(r.request_id)}/decision`, body);
              await A.openRequests();
            } catch (error) {
              const status = td.querySelector(".status");
              status.textContent = error.message;
              status.className = "status error";
            }
          });
        }
      });
    });
})();

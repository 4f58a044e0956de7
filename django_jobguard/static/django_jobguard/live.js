/* Live pages for jobguard's admin: the dashboard and the lists refresh themselves.
 *
 * A page opts in with one element:
 *
 *   <div id="jobguard-live" data-poll-url="…/dashboard/live.json" data-interval="10"
 *        data-targets="#result_list,.paginator" [data-always]>
 *     <button type="button" class="jobguard-live-toggle">…</button>
 *     <span class="jobguard-live-status"></span>
 *   </div>
 *
 * Every `data-interval` seconds it polls the JSON at `data-poll-url`; when its `version`
 * changed (a count, a worker or a lock did; `data-always`: every time) it fetches the page's
 * own URL again and swaps in the fresh copies of the `data-targets` elements. No framework:
 * fetch, DOMParser and replaceWith. It waits while the tab is hidden, while rows are selected
 * or a form field has the focus (so nothing changes under the operator's hand), and while
 * paused: the toggle's state is kept per browser (localStorage). When the JSON cannot be read
 * (no view permission on the queued jobs) it refreshes at each interval instead.
 */
(function () {
    "use strict";
    const root = document.getElementById("jobguard-live");
    if (!root || !window.fetch || !window.DOMParser) {
        return;
    }
    const STORAGE_KEY = "jobguard-live-paused";
    const url = root.dataset.pollUrl || "";
    const every = Math.max(Number(root.dataset.interval) || 10, 1) * 1000;
    const targets = (root.dataset.targets || "").split(",").map((s) => s.trim()).filter(Boolean);
    const always = root.hasAttribute("data-always");
    const toggle = root.querySelector(".jobguard-live-toggle");
    const status = root.querySelector(".jobguard-live-status");
    const text = {
        pause: root.dataset.pauseLabel || "Pause live updates",
        resume: root.dataset.resumeLabel || "Resume live updates",
        paused: root.dataset.pausedText || "Live updates paused.",
        updated: root.dataset.updatedText || "Updated",
        failed: root.dataset.failedText || "Could not refresh:",
    };
    let paused = false;
    try {
        paused = window.localStorage.getItem(STORAGE_KEY) === "1";
    } catch (e) { /* storage disabled: not kept */ }
    let seen = false;  // a first poll was made
    let shown = null;  // the version the page shows
    let running = false;

    function show() {
        root.classList.toggle("jobguard-live-paused", paused);
        root.dataset.state = paused ? "paused" : "live";
        if (toggle) {
            toggle.textContent = paused ? text.resume : text.pause;
            toggle.setAttribute("aria-pressed", paused ? "true" : "false");
        }
        if (paused && status) {
            status.textContent = text.paused;
        }
    }

    function operatorIsBusy() {
        if (document.querySelector("#changelist-form input.action-select:checked")) {
            return true;  // rows are selected for an action
        }
        const active = document.activeElement;  // typing in a field, choosing an action
        return Boolean(active && active.closest("form") && active.matches(
            "textarea, select, input:not([type=checkbox]):not([type=radio])"
            + ":not([type=submit]):not([type=button]):not([type=hidden])"));
    }

    // The JSON's version now; null when there is no JSON for this user (refresh by the clock).
    async function currentVersion() {
        if (!url) {
            return null;
        }
        const response = await fetch(url, {credentials: "same-origin",
                                           headers: {"Accept": "application/json"}});
        return response.ok ? (await response.json()).version : null;
    }

    async function refresh() {
        const response = await fetch(window.location.href, {credentials: "same-origin"});
        if (!response.ok) {
            throw new Error(response.status + " " + response.statusText);
        }
        const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
        if (paused || operatorIsBusy()) {
            return false;  // paused, or rows selected, while the page was on its way
        }
        for (const selector of targets) {
            const olds = document.querySelectorAll(selector);
            const news = fresh.querySelectorAll(selector);
            olds.forEach((old, i) => {
                if (news[i]) {
                    old.replaceWith(document.importNode(news[i], true));
                }
            });
        }
        // Django's changelist actions bind to the rows' checkboxes: bind the new ones.
        const boxes = document.querySelectorAll("tr input.action-select");
        if (window.Actions && boxes.length) {
            window.Actions(boxes);
        }
        root.dataset.refreshes = String(Number(root.dataset.refreshes || 0) + 1);
        document.dispatchEvent(new CustomEvent("jobguard:refreshed"));
        return true;
    }

    async function tick() {
        if (paused || running || document.hidden) {
            return;
        }
        running = true;
        try {
            const now = await currentVersion();
            if (!seen) {
                seen = true;  // the first poll learns the version of the page just rendered
                shown = now;
            } else if ((always || now === null || now !== shown) && !operatorIsBusy()) {
                // The version is taken as shown only once the page is refreshed, so a change
                // seen while rows were selected is shown when the selection is cleared.
                if (await refresh()) {
                    shown = now;
                }
            }
            if (!paused && status) {
                status.textContent = text.updated + " " + new Date().toLocaleTimeString();
            }
        } catch (error) {
            if (status) {
                status.textContent = text.failed + " " + error.message;
            }
        } finally {
            running = false;
        }
    }

    if (toggle) {
        toggle.addEventListener("click", function () {
            paused = !paused;
            try {
                window.localStorage.setItem(STORAGE_KEY, paused ? "1" : "0");
            } catch (e) { /* storage disabled */ }
            show();
            if (!paused) {
                tick();
            }
        });
    }
    show();
    tick();
    window.setInterval(tick, every);
}());

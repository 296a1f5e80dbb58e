/*
 * bucket.c - the compute limiter's arithmetic: launch cost, the shared token bucket and the
 * utilisation controller that sets the bucket's refill rate.
 *
 * Bucket: tokens = credit - launch_cost. A launch costs one atomic add and a compare while the
 * credit covers it (no clock read); only a launch that finds the bucket short reads the clock,
 * adds the credit earned since the last refill (capped at a 20 ms burst) and waits out its debt.
 *
 * Pure functions over region fields and plain numbers (no clocks, no NVML: the in-process
 * fallback's poll, vgpu_ctl_poll, is handed the time and a sampler), so that tests/test_bucket.c
 * and tests/unit/kubelet_plugin/test_governor_dynamics.py can prove convergence against a
 * simulated plant without a GPU. The same controller and windowing rules are implemented by
 * kubelet_plugin/governor.py for the node-side path.
 *
 * Controller: utilisation is modelled as util = gain * cost_rate (cost units launched per
 * second). Each step re-estimates gain from the last window (an EMA weighted by how precise
 * each window's utilisation figure is), then sets rate = (target + integral) / gain. The
 * integral term removes the model's steady-state bias and only integrates while the claim is
 * actually limited (anti-windup), so an application that wants less than its cap does not
 * build up credit and burst later.
 */
#include <math.h>
#include <stdatomic.h>

#include "vgpu.h"

#define BUCKET_BURST_SECONDS 0.02 /* at most 20 ms of budget accumulates while idle */
#define MAX_WAIT_NS 200000000ULL  /* one wait never exceeds 200 ms (the debt stays) */

uint64_t vgpu_bucket_settle(struct vgpu_region_device *d, uint64_t spent, uint64_t cost,
                            uint64_t now_ns) {
    uint64_t rate = atomic_load_explicit(&d->rate, memory_order_relaxed);
    if (rate == 0) return 0;
    /* Refill: whoever advances the stamp adds the credit for the elapsed interval. */
    uint64_t last = atomic_load_explicit(&d->refill_stamp_ns, memory_order_relaxed);
    if (last == 0) {
        /* First limited launch: the bucket starts empty at what was spent before it. */
        if (atomic_compare_exchange_strong(&d->refill_stamp_ns, &last, now_ns))
            atomic_store(&d->credit, spent - cost);
    } else if (now_ns > last &&
               atomic_compare_exchange_strong(&d->refill_stamp_ns, &last, now_ns)) {
        double add = (double)rate * (double)(now_ns - last) / 1e9;
        uint64_t burst = (uint64_t)((double)rate * BUCKET_BURST_SECONDS) + cost;
        uint64_t cap = atomic_load(&d->launch_cost) + burst;
        uint64_t cur = atomic_load(&d->credit);
        uint64_t next;
        do {
            double want = (double)cur + add;
            next = want > (double)cap ? cap : (uint64_t)want;
            if ((int64_t)(next - cur) < 0) next = cur; /* already above the burst: keep */
        } while (!atomic_compare_exchange_weak(&d->credit, &cur, next));
    }
    int64_t short_by = (int64_t)(spent - atomic_load(&d->credit));
    if (short_by <= 0) return 0;
    double wait = (double)short_by * 1e9 / (double)rate;
    if (wait > (double)MAX_WAIT_NS) wait = (double)MAX_WAIT_NS;
    return (uint64_t)wait + 1;
}

uint64_t vgpu_bucket_take(struct vgpu_region_device *d, uint64_t cost, uint64_t now_ns) {
    bool covered;
    uint64_t spent = vgpu_bucket_charge(d, cost, &covered);
    return covered ? 0 : vgpu_bucket_settle(d, spent, cost, now_ns);
}

double vgpu_ctl_step(struct vgpu_ctl_state *st, const struct vgpu_ctl_sample *s,
                     double current_rate) {
    if (s->dt <= 0) return current_rate;
    /* A claim that paused or resumed launching within the window (bursty work, a process
     * descheduled) spent a share of its budget far from the last window's. NVML's sample period
     * does not cover the launches the window does then (it may end before the resumed ones),
     * and under slow polls the next one straddles the change too: a gain learnt from either was
     * up to 2x low (10-15 points over the cap for 0.3-0.7 s after a 150-300 ms pause). Skip
     * both, as after a big change of our own; the rate stays, learnt from steady windows. */
    double before = st->spent;
    double share = current_rate > 0 ? s->cost_rate / current_rate : 0;
    st->spent = current_rate > 0 ? (share > VGPU_SPENT_FLOOR ? share : VGPU_SPENT_FLOOR) : 0;
    bool unsteady = st->gain > 0 && before > 0 && st->spent > 0 &&
                    fabs(st->spent - before) > VGPU_SPENT_CHANGE * before;
    if (unsteady && !st->hold) {
        st->hold = true;
        return current_rate;
    }
    if (st->hold) {
        /* NVML's sample period need not line up with our window: right after a big change
         * it mixes the old and the new rate, and would teach the gain a wrong value. */
        st->hold = false;
        return current_rate;
    }
    bool learning = false, replaced = false;
    /* Once a gain is learnt, it is re-learnt only from windows of at least
     * VGPU_GAIN_WINDOW_MIN_S: a shorter one cannot hold a real driver's sample period (~1/6 s),
     * so a fresh sample over it is one answered twice (it ended while the previous poll's
     * call ran) and sets the rate the previous step just changed against the old period's
     * utilisation (a gain 1.8x low: 23-70 points over the cap), or, under a sampler answering
     * for the caller's own interval, a few ms of a time-sliced GPU, several points off. The
     * target and the integral still act on it. */
    if (s->cost_rate > 0 && (st->gain <= 0 || s->dt >= VGPU_GAIN_WINDOW_MIN_S)) {
        /* Utilisation under half a point is below NVML's resolution: count it as a quarter
         * point, so a gain learnt too high (launches starved to nothing) is corrected instead
         * of freezing the budget, while zero-cost work still gets a generous budget. */
        double seen = s->util > 0.5 ? s->util : 0.25;
        double observed = seen / s->cost_rate;
        learning = st->gain <= 0;
        /* A reading under VGPU_UTIL_RESOLVED (0 or 1 %) spans a factor of three or more of
         * true utilisation: it may lower a learnt gain, to the top of its rounding interval
         * (launches starved to nothing: the correction above), never raise it. A window in
         * which the claim hardly launched (an idle moment, a window cut short) reads 0 over a
         * tiny cost rate, and a quarter point over it taught a gain hundreds of times too high:
         * a claim starved for seconds while the EMA unwound it. */
        if (!learning && s->util < VGPU_UTIL_RESOLVED) {
            /* And it lowers the gain only when the claim spent most of its budget over the
             * window: a starved claim does, while one that resumed launching after an idle
             * moment has its first launches measured against a sample period that ended
             * before them (a reading of 0 lowered the gain 30 %: 13 points over the cap). */
            double top = (s->util + 0.5) / s->cost_rate;
            bool spent = s->cost_rate >= VGPU_BUDGET_SPENT * current_rate;
            observed = top < st->gain && spent ? top : st->gain;
        }
        /* NVML reports integer percent, so a window's relative error is about 1/util: a
         * window at 30 % says far more than the seed window at 2 % the gain was first learnt
         * from. Weigh each by its squared utilisation, and never move by less than the plain
         * EMA step, so a gain learnt too high still unwinds at the EMA's pace. */
        double prior = VGPU_GAIN_MEMORY * st->weight, fresh = seen * seen;
        double step = fresh / (prior + fresh);
        if (step < 1.0 - VGPU_GAIN_MEMORY) step = 1.0 - VGPU_GAIN_MEMORY;
        st->gain = learning ? observed : st->gain + step * (observed - st->gain);
        st->weight = prior + fresh;
        replaced = learning || step > 0.8;
    }
    if (st->gain <= 0) return current_rate; /* nothing learnt yet: keep the current budget */
    double error = s->target - s->util;
    /* Integrate only while limited or over target (anti-windup), and not while the gain
     * estimate is being replaced (learnt from the seed window, or re-learnt from a much
     * better one): that error comes from the old gain, not from a bias of the model. */
    /* Nor of a claim far under its target unless that unwinds the integral: a gain learnt
     * too high is re-learnt at the EMA's pace, and the integral wound up meanwhile took the
     * claim over its cap once the gain was right (47 % for a cap of 30). */
    bool far_under = error > VGPU_INTEGRAL_ERROR_MAX && st->integral >= 0;
    if (!replaced && !far_under && (s->throttled || error < 0)) {
        /* Only small errors are model bias; a large one comes from a target that just moved
         * (balance) and would wind the integral up against the new target. */
        double bounded = error;
        if (bounded > VGPU_INTEGRAL_ERROR_MAX) bounded = VGPU_INTEGRAL_ERROR_MAX;
        if (bounded < -VGPU_INTEGRAL_ERROR_MAX) bounded = -VGPU_INTEGRAL_ERROR_MAX;
        st->integral += 0.5 * bounded;
        double bound = s->target > 10 ? s->target : 10;
        if (st->integral > bound) st->integral = bound;
        if (st->integral < -bound) st->integral = -bound;
    }
    double want = s->target + st->integral;
    if (want < 0.5) want = 0.5;
    double rate = want / st->gain;
    if (!isfinite(rate) || rate < 1) rate = 1;
    bool big_move = fabs(rate - current_rate) > current_rate / 3;
    st->hold = !s->aligned && current_rate > 0 && big_move;
    /* The next window's spent share moves with a big change of our own: not comparable. */
    if (replaced || big_move) st->spent = 0;
    return rate;
}

double vgpu_balance_target(uint32_t cores, double device_util, double own_util) {
    /* Idle capacity of the GPU may be borrowed; keep 5 points of headroom for the others,
     * and never go below the guaranteed cap. */
    double others = device_util - own_util;
    if (others < 0) others = 0;
    /* A full GPU while we borrow means someone else's share is being squeezed (what they get
     * then understates what they want): step back by twice the headroom and let them take it;
     * idle capacity shows again at the next sample if they did not want it. */
    if (device_util >= VGPU_FULL_GPU && own_util > (double)cores && others >= 1.0) {
        double back = own_util - 2 * VGPU_BALANCE_HEADROOM;
        return back > (double)cores ? back : (double)cores;
    }
    /* Borrowing grows by at most VGPU_BORROW_STEP per step: a neighbour that started a moment
     * later is still at its seed rate and looks idle; it reaches its cap before we take its
     * share. */
    double target = 100.0 - others - VGPU_BALANCE_HEADROOM;
    if (target > own_util + VGPU_BORROW_STEP) target = own_util + VGPU_BORROW_STEP;
    return target > (double)cores ? target : (double)cores;
}

/* ---- the in-process fallback controller ---------------------------------------------------- */

#define CTL_PERIOD_NS 100000000ULL     /* controller step every 100 ms once settled */
/* While the controller has no gain yet, or skips a sample that straddles a big rate change (and
 * the last two polls did not both find a fresh sample), it polls NVML this often: a fresh
 * sample comes once per driver period (~1/6 s), and waiting up to
 * 100 ms to notice each one would add that to every step a new claim needs to settle. */
#define CTL_LEARNING_PERIOD_NS 10000000ULL
/* A window end placed between two polls this close is "aligned" (vgpu_ctl_sample.aligned). */
#define CTL_ALIGNED_BRACKET_NS 25000000ULL
/* The driver's sample period assumed for a claim's first sample, whose period began before the
 * first launch (NVML does not say when a period began; real drivers and the simulator: 1/6 s).
 * That sample is learnt from only if the claim launched for at least half of it: a shorter
 * stretch reads a fraction of a percent. Same rule as kubelet_plugin/governor.py. */
#define CTL_SAMPLE_PERIOD_NS 166667000ULL
#define CTL_FIRST_COVERAGE_MIN 0.5
/* Steps after the first learnt one that still poll fast: they correct the first gain (learnt
 * from a seed window that reads a few integer percent) within one sample period each. */
#define CTL_SETTLING_STEPS 2

bool vgpu_ctl_poll(struct vgpu_region_device *rd, uint32_t cores, uint32_t policy, uint64_t now,
                   vgpu_sampler sample, void *ctx) {
    uint64_t last = atomic_load_explicit(&rd->ctl_stamp_ns, memory_order_relaxed);
    /* Fast polls only find a period's end sooner. A sampler that answers for the caller's own
     * interval (the simulator's exact mode) is fresh at every poll, where 10 ms polls would
     * only make 10 ms windows and ten times the steps (balance borrows VGPU_BORROW_STEP per
     * step): after two fresh polls in a row (a real driver's 1/6 s period never gives that
     * while polls are fast) the next poll waits the full period. */
    bool unsettled = atomic_load_explicit(&rd->ctl_gain_bits, memory_order_relaxed) == 0 ||
                     atomic_load_explicit(&rd->ctl_hold, memory_order_relaxed) != 0 ||
                     atomic_load_explicit(&rd->ctl_moved, memory_order_relaxed) != 0 ||
                     atomic_load_explicit(&rd->ctl_steps, memory_order_relaxed) <=
                         CTL_SETTLING_STEPS;
    uint64_t period =
        unsettled && atomic_load_explicit(&rd->ctl_poll_fresh, memory_order_relaxed) < 2
            ? CTL_LEARNING_PERIOD_NS
            : CTL_PERIOD_NS;
    if (last != 0 && now - last < period) return false;
    if (!atomic_compare_exchange_strong(&rd->ctl_stamp_ns, &last, now)) return false;
    /* Elected for this period. The window runs from the end of the last consumed sample. */
    uint64_t cost = atomic_load(&rd->launch_cost);
    uint64_t throttled = atomic_load(&rd->throttled_ns);
    uint64_t start = atomic_load(&rd->ctl_window_ns);
    bool learning = atomic_load(&rd->ctl_gain_bits) == 0;
    /* The previous poll (this one's launch cost is the next one's), and how many polls in a
     * row up to it found a fresh sample (at most 2); a poll that finds none leaves 0 there. */
    uint64_t poll_cost = atomic_exchange(&rd->ctl_poll_cost, cost);
    uint64_t fresh_streak = atomic_exchange(&rd->ctl_poll_fresh, 0);
    bool poll_fresh = fresh_streak != 0;
    if (start == 0 || now - start > 10 * CTL_PERIOD_NS) { /* (re)start of a window */
        atomic_store(&rd->ctl_cost_mark, cost);
        atomic_store(&rd->throttle_mark, throttled);
        atomic_store(&rd->ctl_window_ns, now);
        atomic_store(&rd->ctl_seen_ns, now);
        atomic_store(&rd->ctl_learning_anchor, learning ? 1 : 0);
        return false;
    }
    double device_util = 0, claim_util = 0;
    uint64_t seen = atomic_load(&rd->ctl_seen_ns);
    enum vgpu_sample_result got =
        sample(ctx, now - (seen != 0 && seen < now ? seen : start), &device_util, &claim_util);
    if (got != VGPU_SAMPLE_OK) return false; /* nothing new: the window grows until one comes */
    atomic_store(&rd->ctl_poll_fresh, fresh_streak < 2 ? fresh_streak + 1 : 2);
    atomic_store(&rd->ctl_seen_ns, now);
    /* Where the sample's period ended: between the previous poll and this one when that one
     * found nothing new (a real driver's sample period; midway, where the launch cost is
     * interpolated exactly, the rate being constant between two polls). Two fresh polls in a
     * row: NVML answered for our own interval (the simulator's exact mode) or we poll slower
     * than it publishes; the window then ends now, its end not bracketed. */
    uint64_t end = now, end_cost = cost, bracket = UINT64_MAX;
    if (!poll_fresh && last != 0 && last < now && poll_cost <= cost) {
        end = last + (now - last) / 2;
        end_cost = poll_cost + (cost - poll_cost) / 2;
        bracket = now - last;
    }
    uint64_t cost_mark = atomic_exchange(&rd->ctl_cost_mark, end_cost);
    uint64_t throttle_mark = atomic_exchange(&rd->throttle_mark, throttled);
    atomic_store(&rd->ctl_window_ns, end);
    bool first_sample = false;
    if (atomic_exchange(&rd->ctl_learning_anchor, 0) != 0 && learning) {
        /* The claim's first sample: its period began before the first launch (the seed), when
         * nothing had been launched. Measured over the (assumed) whole period it is learnt
         * from if the claim launched for most of it and it reads at least a point; otherwise
         * it only anchors the window (learning from a period that began before the launches
         * as if they filled it would underestimate the gain and overshoot the cap). */
        uint64_t first = atomic_load(&rd->rate_stamp_ns);
        if (atomic_load(&rd->rate_source) != VGPU_RATE_SEED || claim_util < 1 ||
            bracket > CTL_ALIGNED_BRACKET_NS || first == 0 || end <= first ||
            (double)(end - first) < CTL_FIRST_COVERAGE_MIN * (double)CTL_SAMPLE_PERIOD_NS)
            return false;
        uint64_t span = end - first > CTL_SAMPLE_PERIOD_NS ? end - first : CTL_SAMPLE_PERIOD_NS;
        start = end - span;
        cost_mark = 0;
        first_sample = true;
    }
    if (end <= start) return false;
    atomic_store(&rd->util_milli, (uint64_t)(claim_util * 1000.0));
    struct vgpu_ctl_sample s = {
        .dt = (double)(end - start) / 1e9,
        /* A first sample over part of its period reads a few integer percent: the top of its
         * rounding interval, so the rounding can only leave the claim under its cap. */
        .util = first_sample ? claim_util + 0.5 : claim_util,
        .throttled = throttled > throttle_mark,
        .aligned = bracket <= CTL_ALIGNED_BRACKET_NS,
    };
    s.cost_rate = (double)(end_cost - cost_mark) / s.dt;
    struct vgpu_ctl_state st = {
        .gain = vgpu_bits_to_double(atomic_load(&rd->ctl_gain_bits)),
        .integral = vgpu_bits_to_double(atomic_load(&rd->ctl_integral_bits)),
        .hold = atomic_load(&rd->ctl_hold) != 0,
        .weight = vgpu_bits_to_double(atomic_load(&rd->ctl_weight_bits)),
        .spent = vgpu_bits_to_double(atomic_load(&rd->ctl_spent_bits)),
    };
    /* `balance` borrows only once the gain is learnt and not being re-learnt: claims starting
     * together first reach their caps instead of all jumping at the idle GPU, overfilling it
     * and sorting the split out over many sample periods (governor.py may_borrow). */
    bool may_borrow = st.gain > 0 && !st.hold;
    s.target = policy == VGPU_POLICY_BALANCE && may_borrow
                   ? vgpu_balance_target(cores, device_util, claim_util)
                   : (double)cores;
    double current = (double)atomic_load(&rd->rate);
    double rate = vgpu_ctl_step(&st, &s, current);
    atomic_fetch_add(&rd->ctl_steps, 1);
    atomic_store(&rd->ctl_moved, current > 0 && fabs(rate - current) > current / 3 ? 1 : 0);
    atomic_store(&rd->ctl_gain_bits, vgpu_double_to_bits(st.gain));
    atomic_store(&rd->ctl_integral_bits, vgpu_double_to_bits(st.integral));
    atomic_store(&rd->ctl_hold, st.hold ? 1 : 0);
    atomic_store(&rd->ctl_weight_bits, vgpu_double_to_bits(st.weight));
    atomic_store(&rd->ctl_spent_bits, vgpu_double_to_bits(st.spent));
    if (rate >= 1 && isfinite(rate)) {
        atomic_store(&rd->rate, (uint64_t)rate);
        atomic_store(&rd->rate_stamp_ns, now);
        atomic_store(&rd->rate_source, VGPU_RATE_HOOK);
    }
    return true;
}

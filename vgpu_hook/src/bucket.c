/*
 * bucket.c - the compute limiter's arithmetic: launch cost, the shared token bucket and the
 * utilisation controller that sets the bucket's refill rate.
 *
 * Bucket: tokens = credit - launch_cost. A launch costs one atomic add and a compare while the
 * credit covers it (no clock read); only a launch that finds the bucket short reads the clock,
 * adds the credit earned since the last refill (capped at a 20 ms burst) and waits out its debt.
 *
 * Pure functions over region fields and plain numbers (no clocks, no NVML), so that
 * tests/test_bucket.c can prove convergence against a simulated plant without a GPU. The same
 * controller is implemented by kubelet_plugin/governor.py for the node-side path.
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
    if (st->hold) {
        /* NVML's sample period need not line up with our window: right after a big change
         * it mixes the old and the new rate, and would teach the gain a wrong value. */
        st->hold = false;
        return current_rate;
    }
    bool learning = false, replaced = false;
    if (s->cost_rate > 0) {
        /* Utilisation under half a point is below NVML's resolution: count it as a quarter
         * point, so a gain learnt too high (launches starved to nothing) is corrected instead
         * of freezing the budget, while zero-cost work still gets a generous budget. */
        double seen = s->util > 0.5 ? s->util : 0.25;
        double observed = seen / s->cost_rate;
        learning = st->gain <= 0;
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
    if (!replaced && (s->throttled || error < 0)) {
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
    st->hold = !s->aligned && current_rate > 0 && fabs(rate - current_rate) > current_rate / 3;
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

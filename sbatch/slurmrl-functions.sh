# shellcheck shell=bash disable=SC2154,SC2034  # job.sbatch sets RUN_DIR, LOG_DIR, ... and reads PORT_BASE
# slurmrl-functions.sh, version 2: the machinery every slurmrl job script shares (waiting,
# readiness, teardown, signals, port claims, image import). `slurmrl render` writes it beside
# job.sbatch, which sources it by its absolute path (`source -- RUN_DIR/slurmrl-functions.sh 2`).
# It is the same for every job; what is a job's own (paths, ports, command lines, the start and stop
# order) is in job.sbatch. You may edit it too: `slurmrl diff` shows the edit, lock.toml hashes it.
[[ ${1:-} == 2 ]] || { echo "slurmrl: job.sbatch asks for slurmrl-functions.sh version ${1:-?}; this is version 2" >&2; exit 1; }
((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501)) || { echo "slurmrl: needs bash 5.1 or newer" >&2; exit 1; }
declare -A PID_OF=()    # component -> its srun pid
declare -A NAME_OF=()   # srun pid -> component
declare -A SERVES_ON=() # components whose step serves on when one of its tasks dies (srun --kill-on-bad-exit=0)
UP=0                    # 1 once every component is ready (job.sbatch sets it)
NONCRITICAL=()          # components with critical = false (job.sbatch sets them): an exit is only logged
ORCHESTRATED=()         # an RL job's servers (launch --orchestrated): the orchestrator decides whether the job goes on without them
PY=()                   # the steps' Python (start_nodes sets it): records why the attempt ended
BATCH_LOG="" BATCH_LOG_FROM=0  # this log, and its size as the attempt started (start_nodes sets them)

# phase WHAT: a timestamped start-up milestone, in this log and in LOG_DIR/phases (`slurmrl status`)
phase() {
    printf '%(%s)T %s\n' -1 "$*" >>"${LOG_DIR}/phases"
    printf 'slurmrl: %(%H:%M:%S)T %s\n' -1 "$*"
}

# begin_attempt: folders, the job's end time and secret for the task functions, the first phase.
begin_attempt() {
    rm -rf "${READY_DIR}" "${LOG_DIR}/ended"  # readiness markers and end records of an earlier run of this attempt
    mkdir -p "${LOG_DIR}" "${READY_DIR}"
    export RUN_DIR SLURMRL_RUN_DIR="${RUN_DIR}" SLURMRL_ATTEMPT="${ATTEMPT}"  # task functions read them
    # when Slurm ends this attempt, in epoch seconds (empty without a time limit): the trainer saves
    # early when the save the warning signal asks for might not finish before it
    JOB_END="$(squeue -h -j "${SLURM_JOB_ID}" -o %e 2>/dev/null | head -n1 || true)"
    SLURMRL_JOB_END="$( [[ ${JOB_END} == [0-9]*-*T* ]] && date -d "${JOB_END}" +%s 2>/dev/null || true)"
    export SLURMRL_JOB_END
    if [[ ${ENVIRONMENT:-} != BATCH ]]; then  # `bash job.sbatch` inside salloc: `slurmrl status RUN_DIR` finds it here
        echo "${SLURM_JOB_ID}" >>"${RUN_DIR}/allocations"
    fi
    # the job's secret: requests to its servers and router need `Authorization: Bearer <RUN_DIR/secret>`;
    # made once per run dir, never printed; steps get only its path
    export SLURMRL_SECRET_FILE="${RUN_DIR}/secret"
    [[ -s ${SLURMRL_SECRET_FILE} ]] || (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"${SLURMRL_SECRET_FILE}")
    phase "allocation: job ${SLURM_JOB_ID} attempt ${ATTEMPT} on $(hostname), logs in ${LOG_DIR}"
}

# group_nodes INDEX: the hostnames of a het group, in allocation order.
group_nodes() {
    local var="SLURM_JOB_NODELIST_HET_GROUP_$1"
    if [[ -n ${SLURM_HET_SIZE:-} ]]; then scontrol show hostnames "${!var}"; else scontrol show hostnames "${SLURM_JOB_NODELIST}"; fi
}

# launch [--orchestrated] NAME CMD...: start one component's srun in the background. --orchestrated: the
# servers of an RL job, whose end is not the job's (servers_gone: the orchestrator decides).
launch() {
    if [[ $1 == --orchestrated ]]; then
        shift
        ORCHESTRATED+=("$1")
    fi
    local name=$1
    shift
    [[ " $* " != *" --kill-on-bad-exit=0 "* ]] || SERVES_ON[$name]=1
    "$@" &
    PID_OF[$name]=$!
    NAME_OF[$!]=$name
    echo "slurmrl: started ${name} (srun pid $!)"
}

# Readiness. Each task's supervisor runs its own check (its --ready URL), then writes
# ready/attempt-N/<component>.<task>: the URL it serves at ("-" for none) and its step's task
# count. wait_ready waits for every task's file, then checks each URL from here as well.
url_ok() {
    local hostport host port
    hostport=${1#*://}
    hostport=${hostport%%/*}
    host=${hostport%:*} port=${hostport##*:}
    if [[ $1 == http://* ]]; then
        (
            exec 3<>"/dev/tcp/${host}/${port}" || exit 1
            printf 'GET /health HTTP/1.0\r\nHost: %s\r\n\r\n' "${host}" >&3
            read -r -t 5 _ status _ <&3 && [[ $status == 200 ]]
        ) 2>/dev/null
    else
        (exec 3<>"/dev/tcp/${host}/${port}") 2>/dev/null
    fi
}

# ready_urls NAME: the URLs NAME's tasks serve at, in task order, on one line.
ready_urls() {
    local i url ntasks urls=()
    { read -r _ && read -r ntasks; } <"${READY_DIR}/$1.0"
    for ((i = 0; i < ntasks; i++)); do
        read -r url <"${READY_DIR}/$1.${i}"
        [[ $url == - ]] || urls+=("${url}")
    done
    echo "${urls[*]}"
}

# still_starting NAME SECONDS DEADLINE WHAT: fail at once if NAME's srun has exited, or at the deadline.
# LOG_DIR/NAME.waiting: why a front does not serve yet (its supervisor's completion check).
still_starting() {
    local why=""
    [[ ! -s ${LOG_DIR}/$1.waiting ]] || read -r why <"${LOG_DIR}/$1.waiting" || true
    if ! kill -0 "${PID_OF[$1]}" 2>/dev/null; then
        slurm_ending  # inside salloc, a cancel ends the steps and sends this shell nothing
        [[ -z ${ENDING} ]] || slurm_stopped "$1 ended before it was ready as Slurm ended the job"
        abort "$1 exited before it was ready ($4)${why:+; ${why}}"
    fi
    ((SECONDS < $3)) || abort "$1 not ready after $2s ($4)${why:+; ${why}}"
}

# wait_ready NAME SECONDS: poll until every task of NAME is ready and answers from here. Polling
# is not a barrier: the next stage starts on success.
wait_ready() {
    local name=$1 seconds=$2 deadline=$((SECONDS + $2)) f have ntasks url urls
    while :; do
        have=0 ntasks=0
        for f in "${READY_DIR}/${name}".*; do
            [[ -e $f ]] || continue
            { read -r _ && read -r ntasks; } <"$f"
            have=$((have + 1))
        done
        ((ntasks > 0 && have >= ntasks)) && break
        still_starting "${name}" "${seconds}" "${deadline}" "${have} of ${ntasks} task(s) ready"
        sleep 1
    done
    read -ra urls <<<"$(ready_urls "${name}")"
    for url in "${urls[@]}"; do
        until url_ok "${url}"; do
            still_starting "${name}" "${seconds}" "${deadline}" "${url} does not answer from $(hostname)"
            sleep 1
        done
    done
    phase "${name} ready (${have} task(s)${urls[*]:+: ${urls[*]}})"
}

# stop_steps SECONDS NAME...: TERM to the tasks of these components' steps (scancel --signal
# only signals; srun itself would turn TERM into a kill), then up to SECONDS for them to exit.
stop_steps() {
    local seconds=$1 id name pid alive
    shift
    local -A want=()
    local deadline=$((SECONDS + seconds))
    for name in "$@"; do want[$name]=1; done
    while read -r id name; do
        if [[ -n ${want[$name]:-} ]]; then scancel --signal=TERM "${id}" 2>/dev/null || true; fi
    done < <(squeue -h -s -j "${JOB_IDS}" -o "%i %j" 2>/dev/null)
    while ((SECONDS < deadline)); do
        alive=0
        for pid in "${!NAME_OF[@]}"; do
            if [[ -n ${want[${NAME_OF[$pid]}]:-} ]] && kill -0 "${pid}" 2>/dev/null; then alive=1; fi
        done
        ((alive)) || return 0
        sleep 1
    done
}

# stop_all: a planned stop, in job.sbatch's stop_components order (callers before what they call:
# the trainer and orchestrator first, with GRACE_SECONDS to checkpoint), then end the steps that
# are left. Only this job's steps are signalled.
stop_all() {
    local pids=("${!NAME_OF[@]}")
    ((${#pids[@]})) || return 0
    echo "slurmrl: stopping ${NAME_OF[*]} (in reverse start order; TERM, then up to ${GRACE_SECONDS}s to flush)"
    phase "teardown: ${NAME_OF[*]}"  # `slurmrl status` labels these steps: the script ended them
    stop_components
    kill -TERM "${!NAME_OF[@]}" 2>/dev/null || true  # srun ends its step now
    wait 2>/dev/null || true
}

# first_failure: set BLAME to "COMPONENT CAUSE" for the task that failed first ("trainer exited with code 3",
# "orchestrator: ZeroDivisionError in env.py:36: ..." when a failure probe named it), from the end records
# the steps write as their commands end (LOG_DIR/ended/<component>.<task>: "<time ns> <code> <state>
# <tasks> <cause>", slurmrl.rundir.ended); empty when none did. A task of a step that serves on
# without it (SERVES_ON) counts once its whole step has ended.
first_failure() {
    local f t code state ntasks cause name first=""
    BLAME=""
    for f in "${LOG_DIR}/ended/"*; do
        [[ -f ${f} ]] || continue
        t="" code="" state="" ntasks="" cause="" name=${f##*/}
        read -r t code state ntasks cause <"${f}" || true
        [[ ${state} == failed && ${t} =~ ^[0-9]{1,19}$ && ${ntasks} =~ ^[0-9]{1,9}$ && ${name##*.} =~ ^[0-9]+$ ]] || continue
        if [[ -n ${SERVES_ON[${name%.*}]:-} ]] && kill -0 "${PID_OF[${name%.*}]}" 2>/dev/null; then continue; fi
        [[ " ${NONCRITICAL[*]} " != *" ${name%.*} "* ]] || continue  # critical = false: never the cause
        [[ " ${ORCHESTRATED[*]} " != *" ${name%.*} "* ]] || continue  # the orchestrator names why it cannot go on
        if [[ -z ${first} ]] || ((t < first)); then
            first=${t}
            ((ntasks > 1)) || name=${name%.*}
            case ${cause:=exited with code ${code}} in
                "exited "* | "killed "* | hung* | "ended "*) BLAME="${name} ${cause}" ;;  # slurmrl.rundir.ended.phrase
                *) BLAME="${name}: ${cause}" ;;
            esac
        fi
    done
}

# abort REASON: fail fast. Record why (the task that failed first and its cause when the steps'
# end records say, else REASON), stop everything, exit non-zero; unless Slurm is ending the job (a
# step, a staging or port srun it ended): then it is a stop (STOPPED, slurm_stopped).
abort() {
    trap '' TERM "${WARN_SIGNAL}"  # a second signal must not cut the stop short
    slurm_ending
    [[ -z ${ENDING} ]] || slurm_stopped "$1, as Slurm ended the job"
    requeue_for_node "$1" || true  # a node Slurm or the node check holds bad: requeued without it (exits)
    sleep 1  # the end records of tasks that ended just before this one
    first_failure
    echo "slurmrl: FAILED: ${BLAME:-$1}${BLAME:+ (the script saw: $1)}" >&2
    echo "${BLAME:-$1}" >"${LOG_DIR}/FAILED"
    [[ -s ${LOG_DIR}/END ]] || note_end application no "an application failure is not requeued: ${BLAME:-$1}"
    stop_all
    record_end
    exit 1
}

# requeue_refusal: set REFUSAL to why the job must not requeue after the warning signal (empty:
# it may). MAX_REQUEUES empty: slurm.requeue is off; MAX_TOTAL_SECONDS: slurm.max_total_time.
# No command substitution here or in on_warning: bash 5.2 exits from a trap that
# interrupted `wait -n` when a $(...) runs in it under set -e.
requeue_refusal() {
    local first now
    REFUSAL=""
    count_requeues
    if [[ -z ${MAX_REQUEUES:-} ]]; then
        REFUSAL="slurm.requeue is off"
    elif [[ ${ENVIRONMENT:-} != BATCH ]]; then
        REFUSAL="not a batch job (bash job.sbatch inside salloc)"
    elif ((!UP)); then
        REFUSAL="it came before every component was ready; another attempt would start over the same way"
    elif ((USED_REQUEUES >= MAX_REQUEUES)); then
        REFUSAL="requeued ${USED_REQUEUES} time(s) already: slurm.max_requeues"
    elif [[ -n ${MAX_TOTAL_SECONDS:-} ]]; then
        read -r first _ <"${RUN_DIR}/logs/attempt-0/phases" || first=0
        printf -v now '%(%s)T' -1
        if ((now - first >= MAX_TOTAL_SECONDS)); then
            REFUSAL="the job has run ${MAX_TOTAL_SECONDS} s over all attempts: slurm.max_total_time"
        fi
    fi
}

# on_warning: the time limit or a preemption is near (sbatch --signal, WARN_SIGNAL). Components
# checkpoint on TERM; then the job goes back to the queue and resumes from the checkpoint, unless
# requeue_refusal says why not: then the run stopped before its end and the job exits STOPPED_EARLY
# (never 0: Slurm's COMPLETED, an afterok dependency and `status --watch` mean the run finished).
STOPPED_EARLY=75  # EX_TEMPFAIL: checkpointed; submitting the run dir again resumes it (docs/rl.md)
on_warning() {
    trap '' TERM "${WARN_SIGNAL}"  # a second signal must not cut the stop short
    requeue_refusal
    note_warning_end
    echo "slurmrl: got SIG${WARN_SIGNAL}: checkpoint and ${REFUSAL:+stop: }${REFUSAL:-requeue}"
    echo "warning signal: ${REFUSAL:+stopped before the end, not requeued: }${REFUSAL:-requeued as attempt $((ATTEMPT + 1))}" >"${LOG_DIR}/PREEMPTED"
    stop_all
    if [[ -z ${REFUSAL} ]]; then
        scontrol requeue "${SLURM_JOB_ID}"
        exit 0
    fi
    record_end  # the job ends here: no next attempt records it
    if ((!UP)); then
        echo "warning signal before the job was up: ${REFUSAL}" >"${LOG_DIR}/FAILED"
        exit 1
    fi
    exit "${STOPPED_EARLY}"
}

# slurm_ending: set ENDING when Slurm itself is ending this job (scancel, the time limit, a
# preemption, a revoked salloc allocation: "ended"; scontrol requeue, which counts a restart:
# "requeued"); empty while the job runs, or when squeue cannot say. No $(...): see requeue_refusal.
slurm_ending() {
    local state="" restarts="" file="${LOG_DIR}/.slurm-state"
    ENDING=""
    if ! squeue -h -j "${SLURM_JOB_ID}" -O "State,RestartCnt" >"${file}" 2>&1; then
        if grep -q "Invalid job id" "${file}" 2>/dev/null; then ENDING=ended; fi  # gone from the controller
        return 0
    fi
    read -r state restarts <"${file}" || true
    case ${state} in
        RUNNING | CONFIGURING | SUSPENDED | SIGNALING) ;;
        *)
            ENDING=ended
            if [[ ${restarts} =~ ^[0-9]+$ ]] && ((restarts > ATTEMPT)); then ENDING=requeued; fi
            ;;
    esac
}

# slurm_stopped WHAT: Slurm ends the job (ENDING): not a failure of the job's own. Recorded as
# STOPPED (`slurmrl status` says which it was from Slurm's state), components stopped in order.
slurm_stopped() {
    trap '' TERM "${WARN_SIGNAL}"
    note_slurm_end "$1"  # first: Slurm gives a batch shell it ends seconds (KillWait)
    local why="cancel, time limit or preemption"
    if [[ ${ENDING:-} == requeued ]]; then
        why="requeued by Slurm (scontrol requeue, or a preemption that requeues): attempt $((ATTEMPT + 1)) follows"
    fi
    echo "slurmrl: $1 (${why}): stopping"
    echo "$1 (${why})" >"${LOG_DIR}/STOPPED"
    stop_all
    [[ ${ENDING:-} == requeued ]] || record_end  # a requeued job's next attempt records it
    exit 143
}

# on_term: Slurm ends the job (scancel, the time limit, a preemption without requeue, a requeue).
on_term() {
    trap '' TERM "${WARN_SIGNAL}"
    slurm_ending
    slurm_stopped "got SIGTERM from Slurm"
}

# ---- why an attempt ended, and bad nodes kept out (slurmrl.contract.attempt_end) ------------
# Each end writes LOG_DIR/END: "<time> <class> <requeued: yes|no> <why>", class node, preemption,
# time_limit, cancel or application. A node Slurm holds down, drained, failing or not responding (or
# that the node check named) is a node end: it goes to LOG_DIR/NODE_FAULTS and the job's ExcNodeList,
# and the job is requeued without it within slurm.max_requeues; an application failure never is.
# The next attempt records both notes as events (slurmrl.runtime.steps.attempts). No $(...) in
# these: they run in traps (see requeue_refusal).
WARN_NEAR_S=900  # the warning signal this close to the time limit is the time limit's; earlier, a preemption's

# note_end CLASS REQUEUED WHY: the attempt's END note.
note_end() {
    printf '%(%s)T %s %s %s\n' -1 "$1" "$2" "$3" >"${LOG_DIR}/END"
}

# find_bad_nodes: add the job's nodes Slurm holds bad to LOG_DIR/NODE_FAULTS; BAD_NODES: every node
# named there (comma-separated; empty: none).
find_bad_nodes() {
    local var nodes="" node reason file="${LOG_DIR}/.bad-nodes"
    for var in "${!SLURMRL_NODES_G@}"; do nodes+="${!var} "; done
    nodes=${nodes% }
    nodes=${nodes// /,}
    nodes=${nodes:-${SLURM_JOB_NODELIST:-}}
    BAD_NODES=""
    if [[ -n ${nodes} ]] && sinfo -h -N -n "${nodes}" -t down,drain,fail,no_respond -o "%N %E" >"${file}" 2>/dev/null; then
        while read -r node reason || [[ -n ${node} ]]; do
            [[ -z ${node} ]] || echo "${node} Slurm: ${reason:-down}" >>"${LOG_DIR}/NODE_FAULTS"
        done <"${file}"
    fi
    # a node back in service at once (ReturnToService with its slurmd alive): srun said which it lost;
    # a task the kernel killed for a hardware error (SIGBUS, "Bus error", or exit code 135 = 128+SIGBUS
    # from a shell or the step's guard, which also names its node itself): srun says where
    if [[ -f ${BATCH_LOG:-} ]] && tail -c "+$((BATCH_LOG_FROM + 1))" "${BATCH_LOG}" >"${file}" 2>/dev/null; then
        while read -r reason; do
            if [[ ${reason} =~ ^srun:\ error:\ Node\ failure\ on\ ([^ ]+)$ ]]; then
                echo "${BASH_REMATCH[1]} srun: node failure (Slurm ended the job's steps there)" >>"${LOG_DIR}/NODE_FAULTS"
            elif [[ ${reason} =~ ^srun:\ error:\ ([^ :]+):\ tasks?\ [0-9,-]+:\ (Bus\ error|Exited\ with\ exit\ code\ 135) ]]; then
                hardware_fault_on "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
            fi
        done <"${file}"
    fi
    [[ -f ${LOG_DIR}/NODE_FAULTS ]] || return 0
    # only a node name (a host name: letters, digits, '.', '_', '-') reaches scontrol: a line that is not
    # one (a host list, a stray word) would exclude other nodes or break the update for all of them
    while read -r node _; do
        if [[ ! ${node} =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
            [[ -z ${node} ]] || echo "slurmrl: NODE_FAULTS names '${node}', not a node name: not excluded" >&2
            continue
        fi
        [[ ,${BAD_NODES}, == *,${node},* ]] || BAD_NODES+="${BAD_NODES:+,}${node}"
    done <"${LOG_DIR}/NODE_FAULTS"
}

# hardware_fault_on HOSTS WHAT: srun said a task on HOSTS (a node, or a Slurm host list) died of SIGBUS.
hardware_fault_on() {
    local node hosts="${LOG_DIR}/.bus-hosts"
    echo "$1" >"${hosts}"
    [[ $1 != *"["* ]] || scontrol show hostnames "$1" >"${hosts}" 2>/dev/null || true
    while read -r node; do
        [[ -z ${node} ]] || echo "${node} srun: a task was killed by SIGBUS (${2}): a hardware error (machine check or memory failure)" >>"${LOG_DIR}/NODE_FAULTS"
    done <"${hosts}"
}

# exclude_bad_nodes: add BAD_NODES to each het component's ExcNodeList: Slurm keeps it over every
# requeue (it takes the update while the job completes, or waits in the queue).
exclude_bad_nodes() {
    local id line exc file="${LOG_DIR}/.job"
    for id in ${JOB_IDS//,/ }; do
        exc=""
        if scontrol show job -o "${id}" >"${file}" 2>/dev/null; then
            read -r line <"${file}" || true
            if [[ ${line} =~ ExcNodeList=([^ ]+) && ${BASH_REMATCH[1]} != "(null)" ]]; then exc=${BASH_REMATCH[1]}; fi
        fi
        scontrol update "jobid=${id}" "ExcNodeList=${exc:+${exc},}${BAD_NODES}" ||
            echo "slurmrl: could not exclude ${BAD_NODES} from job ${id}" >&2
    done
    echo "slurmrl: node(s) ${BAD_NODES} excluded from this job's later attempts"
}

# count_requeues: USED_REQUEUES, the requeues of slurm.max_requeues the job used (one budget): the
# warning signal's (a PREEMPTED note that says so) and the node faults' (END notes "node yes", Slurm's
# own NODE_FAIL requeue included); a manual scontrol requeue uses none (slurmrl.contract.attempt_end).
count_requeues() {
    local f line cls requeued
    USED_REQUEUES=0
    for f in "${RUN_DIR}"/logs/attempt-*/PREEMPTED "${RUN_DIR}"/logs/attempt-*/END; do
        line="" cls="" requeued=""
        [[ -f ${f} ]] || continue
        if [[ ${f} == */PREEMPTED ]]; then
            read -r line <"${f}" || true
            [[ ${line} != *"requeued as attempt"* ]] || USED_REQUEUES=$((USED_REQUEUES + 1))
        else
            read -r _ cls requeued _ <"${f}" || true
            [[ "${cls} ${requeued}" != "node yes" ]] || USED_REQUEUES=$((USED_REQUEUES + 1))
        fi
    done
}

# node_requeue_refusal: set REFUSAL to why a node end must not requeue (empty: it may).
node_requeue_refusal() {
    REFUSAL=""
    count_requeues
    if [[ -z ${MAX_REQUEUES:-} ]]; then
        REFUSAL="slurm.requeue is off"
    elif [[ ${ENVIRONMENT:-} != BATCH ]]; then
        REFUSAL="not a batch job (bash job.sbatch inside salloc)"
    elif ((USED_REQUEUES >= MAX_REQUEUES)); then
        REFUSAL="requeued ${USED_REQUEUES} time(s) already (the warning signal, node faults): slurm.max_requeues"
    fi
}

# requeue_for_node WHAT: when a node of the job is bad, the attempt ended for the node, not the job:
# exclude it and requeue (exits), or note why not. Returns 1 when no node is bad or it may not requeue.
# Slurm 22.05 refuses ExcNodeList on a running job ("Job is no longer pending execution") and takes it
# once the job is requeued (while it completes): so the requeue first, then the exclusion. Should the
# job start again before it lands, the node check turns the node away (the run's NODE_FAULTS).
requeue_for_node() {
    find_bad_nodes
    [[ -n ${BAD_NODES} ]] || return 1
    node_requeue_refusal
    if [[ -n ${REFUSAL} ]]; then
        note_end node no "node(s) ${BAD_NODES} bad ($1); not requeued: ${REFUSAL}"
        return 1
    fi
    note_end node yes "node(s) ${BAD_NODES} bad ($1); requeued as attempt $((ATTEMPT + 1)) without them"
    phase "node fault on ${BAD_NODES}: requeued without them"
    stop_all
    scontrol requeue "${SLURM_JOB_ID}"
    exclude_bad_nodes
    exit 0
}

# note_slurm_end WHAT: Slurm ends the attempt (ENDING, slurm_ending): a bad node (NODE_FAIL, a node
# set down) is excluded from the requeued job at once, before it may start again; else the class
# from Slurm's state and the time limit.
note_slurm_end() {
    local state="" now
    find_bad_nodes
    if [[ -n ${BAD_NODES} ]]; then
        exclude_bad_nodes
        if [[ ${ENDING:-} == requeued ]]; then
            note_end node yes "node(s) ${BAD_NODES} failed; Slurm requeued the job: attempt $((ATTEMPT + 1)) runs without them"
        else
            note_end node no "node(s) ${BAD_NODES} failed; Slurm ended the job without a requeue ($1)"
        fi
        return 0
    fi
    [[ ! -f ${LOG_DIR}/.slurm-state ]] || read -r state _ <"${LOG_DIR}/.slurm-state" || true
    printf -v now '%(%s)T' -1
    if [[ ${ENDING:-} == requeued ]]; then
        note_end preemption yes "requeued by Slurm (scontrol requeue, or a preemption): $1"
    elif [[ ${state} == PREEMPTED ]]; then
        note_end preemption no "preempted: $1"
    elif [[ ${state} == TIMEOUT ]] || { [[ -n ${SLURMRL_JOB_END:-} ]] && ((now + 60 >= SLURMRL_JOB_END)); }; then
        note_end time_limit no "the time limit: $1"
    else
        note_end cancel no "cancelled: $1"
    fi
}

# note_warning_end: the warning signal's end (after requeue_refusal): the time limit's, or a preemption's.
note_warning_end() {
    local cls=preemption now
    printf -v now '%(%s)T' -1
    if [[ -n ${SLURMRL_JOB_END:-} ]] && ((now + WARN_NEAR_S >= SLURMRL_JOB_END)); then cls=time_limit; fi
    if [[ -z ${REFUSAL} ]]; then
        note_end "${cls}" yes "the warning signal (SIG${WARN_SIGNAL}): requeued as attempt $((ATTEMPT + 1))"
    else
        note_end "${cls}" no "the warning signal (SIG${WARN_SIGNAL}): not requeued: ${REFUSAL}"
    fi
}

# start_nodes: before anything starts: earlier attempts' ends and bad nodes recorded as events, and
# this allocation checked against the nodes the run excluded (slurmrl.runtime.steps.attempts).
# record_end: this attempt's END note (and NODE_FAULTS) as events now, with the steps' Python, where
# no later attempt will (the job ends here); best effort: status reads the notes too.
record_end() {
    ((!${#PY[@]})) || "${PY[@]}" -m slurmrl.runtime.steps.attempts record || true
}

# start_nodes PYTHON...: before anything starts, with the steps' Python: earlier attempts' ends and
# bad nodes recorded as events (slurmrl.runtime.steps.attempts; where that Python does not run here,
# as in a container, the next `status` reads the notes); stop when node faults used up slurm.max_requeues.
start_nodes() {
    local rc=0
    PY=("$@")
    BATCH_LOG="${RUN_DIR}/logs/batch-${SLURM_JOB_ID}.out"  # as rendered (#SBATCH --output): find_bad_nodes reads srun's
    BATCH_LOG_FROM=$(stat -c %s "${BATCH_LOG}" 2>/dev/null || echo 0)  # words of this attempt
    export SLURMRL_JOB_IDS="${JOB_IDS}"  # the node check's own job: its earlier attempts' tasks are leftovers
    "${PY[@]}" -m slurmrl.runtime.steps.attempts start "${MAX_REQUEUES:-}" || rc=$?
    case ${rc} in
        0) ;;
        4) abort "node faults requeued the job more often than slurm.max_requeues (${MAX_REQUEUES}) allows" ;;
        *) echo "slurmrl: could not record earlier attempts' ends (${PY[*]}: exit ${rc}); status reads their notes" >&2 ;;
    esac
}

# nodes_failed WHAT [GROUP]: the node check failed: abort requeues without the node it named, or fails
# naming it. A node where the check never started (its container did not start there, say) while it
# started on others of the group is named bad; where it started nowhere, the image or the job is at fault.
nodes_failed() {
    local why="" node task=0 started=0 missed=() nodes="SLURMRL_NODES_G${2:-}"
    if [[ -n ${2:-} && -n ${!nodes:-} ]]; then
        for node in ${!nodes}; do
            if grep -qs -e ": cleanup: " -e ": BAD: " "${LOG_DIR}/nodes.g$2.${task}.log"; then
                started=1
            else
                missed+=("${node}")
            fi
            task=$((task + 1))
        done
        if ((started)); then
            for node in "${missed[@]}"; do
                echo "${node} the node check did not start there (its container or Python did not start: ${LOG_DIR}/nodes.g$2.*.log)" >>"${LOG_DIR}/NODE_FAULTS"
            done
        fi
    fi
    [[ ! -f ${LOG_DIR}/NODE_FAULTS ]] || why=$(paste -sd ';' "${LOG_DIR}/NODE_FAULTS")
    abort "$1 failed${why:+: ${why}}"
}

# supervise MAIN...: wait for steps to end. Success when every MAIN component exits 0;
# any non-zero exit, or any other component ending, fails the whole job at once, except for a
# component in NONCRITICAL (critical = false), whose exit is only logged.
supervise() {
    local -A main=()
    local name pid p rc left=$#
    for name in "$@"; do main[$name]=1; done
    while ((left > 0)); do
        pid="" rc=0
        # a step that ended before this wait is no longer a job to `wait -n` (bash 5.2 answers
        # "no such job" and unsets pid): collect it by pid first; wait PID keeps its status
        for p in "${!NAME_OF[@]}"; do
            if ! kill -0 "${p}" 2>/dev/null; then
                pid=${p}
                wait "${p}" || rc=$?
                break
            fi
        done
        [[ -n ${pid} ]] || wait -n -p pid "${!NAME_OF[@]}" || rc=$?
        if [[ -z ${pid:-} ]]; then  # woken by a signal (its trap has run), or it ended just now
            ((rc != 127)) || sleep 0.2
            continue
        fi
        name=${NAME_OF[$pid]}
        unset "NAME_OF[$pid]"
        if [[ " ${NONCRITICAL[*]} " == *" ${name} "* ]]; then  # critical = false: logged, the job goes on
            phase "${name} exited with code ${rc} (critical = false: the job goes on)"
            continue
        fi
        if ((rc != 0)) || [[ -z ${main[$name]:-} ]]; then
            # inside salloc no TERM reaches this shell: a step Slurm ended (scancel, a requeue) is a stop
            slurm_ending
            [[ -z ${ENDING} ]] || slurm_stopped "${name} ended with code ${rc} as Slurm ended the job"
        fi
        if [[ " ${ORCHESTRATED[*]} " == *" ${name} "* ]]; then servers_gone "${name}" "${rc}"; continue; fi
        ((rc != 124)) || abort "${name} hung: no heartbeat within slurm.heartbeat_timeout (see its log)"
        ((rc == 0)) || abort "${name} exited with code ${rc}"
        [[ -n ${main[$name]:-} ]] || abort "${name} exited while the job was still running"
        echo "slurmrl: ${name} finished"
        left=$((left - 1))
    done
    echo "slurmrl: all done"
    stop_all
}

# servers_gone NAME CODE: every task of NAME, servers of an RL job, has ended (each restarted in place
# while its restart policy allowed: RUN_DIR/events.jsonl). Not the job's end: logged (a phase, with each
# task's cause from its end record), and the orchestrator, which routes around dead servers, decides from
# its live set (inference.min_servers) whether the job goes on; when it cannot, it fails naming why.
servers_gone() {
    local f t code state ntasks cause causes=()
    for f in "${LOG_DIR}/ended/$1".*; do
        [[ -f ${f} ]] || continue
        t="" code="" state="" ntasks="" cause=""
        read -r t code state ntasks cause <"${f}" || true
        causes+=("${f##*/} ${cause:-exited with code ${code}}")
    done
    phase "$1: every task has ended (srun code $2${causes[*]:+; $(IFS=';' && echo "${causes[*]}")}); the job goes on, the orchestrator decides"
}

# ---- port claims ---------------------------------------------------------------------------
# The job claims a block of ports on every node it runs on, starting at the block its job id
# points to: claim_ports_here writes an O_EXCL claim file on the node (taking one over only
# from a job that no longer runs) and checks that no port of the block answers. A block taken
# on any node is released and the next one tried, so jobs sharing a node never collide.
PORT_CLAIMS="${SLURMRL_PORT_CLAIMS:-/dev/shm/slurmrl-ports}"
export PORT_CLAIMS

# claim_ports_here BASE OFFSETS...: on this node, claim BASE for this job; fail if it is taken.
claim_ports_here() {
    local base=$1 dir f owner off
    shift
    dir="${PORT_CLAIMS}/$(hostname)"
    f="${dir}/${base}"
    mkdir -p "${dir}"
    if ! (set -o noclobber && echo "${SLURM_JOB_ID}" >"${f}") 2>/dev/null; then
        read -r owner <"${f}" || owner=
        if [[ ${owner} != "${SLURM_JOB_ID}" ]]; then
            if [[ -n ${owner} ]] && squeue -h -j "${owner}" -t R,CG,CF,S -o %i 2>/dev/null | grep -q .; then
                echo "ports ${base}+ are held by running job ${owner} on $(hostname)"
                return 1
            fi
            rm -f "${f}"  # a claim of a job that no longer runs; whoever creates it first gets it
            (set -o noclobber && echo "${SLURM_JOB_ID}" >"${f}") 2>/dev/null || return 1
        fi
    fi
    for off in "$@"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$((base + off))") 2>/dev/null; then
            echo "port $((base + off)) is in use on $(hostname)"
            release_ports_here "${base}"
            return 1
        fi
    done
}

# release_ports_here BASE: drop this job's claim on BASE on this node.
release_ports_here() {
    local f owner
    f="${PORT_CLAIMS}/$(hostname)/$1"
    read -r owner <"${f}" 2>/dev/null || return 0
    if [[ ${owner} == "${SLURM_JOB_ID}" ]]; then rm -f "${f}"; fi
}
export -f claim_ports_here release_ports_here

# ephemeral_range_here: write "NODE LO HI" (the ports this node's kernel hands to outgoing
# connections: a server's port there can be taken by any connect) to PORT_RANGES/NODE.
ephemeral_range_here() {
    local lo hi
    read -r lo hi </proc/sys/net/ipv4/ip_local_port_range || return 1
    echo "$(hostname) ${lo} ${hi}" >"${PORT_RANGES}/$(hostname)"
}
export -f ephemeral_range_here

# port_blocks_outside BASES...: those of BASES whose block of 200 ports overlaps no
# range of the "NODE LO HI" lines on stdin; all blocks (10000 upwards, then downwards
# from it, 1024-65535) without BASES.
port_blocks_outside() {
    local -a lo=() hi=() bases=("$@")
    local node l h b i
    while read -r node l h; do lo+=("${l}") hi+=("${h}"); done
    ((${#bases[@]})) || mapfile -t bases < <(seq 10000 200 65336
                                             seq 9800 -200 1024)
    for b in "${bases[@]}"; do
        for i in "${!lo[@]}"; do
            ((b > hi[i] || b + 200 - 1 < lo[i])) || continue 2
        done
        echo "${b}"
    done
}

# no_port_block [BASE]: the one line naming the nodes whose ephemeral range leaves no block (or
# overlaps BASE's block), or all of them when only their ranges together do.
no_port_block() {
    local node lo hi what="every block of 200 ports" names
    [[ -z ${1:-} ]] || what="placement.port_base: ports $1-$(($1 + 200 - 1))"
    local -a all=() alone=()
    while read -r node lo hi; do
        all+=("${node} (ports ${lo}-${hi})")
        [[ -n $(port_blocks_outside "$@" <<<"${node} ${lo} ${hi}") ]] || alone+=("${node} (ports ${lo}-${hi})")
    done < <(cat "${PORT_RANGES}"/*)
    ((${#alone[@]})) || alone=("${all[@]}")
    printf -v names '%s, ' "${alone[@]}"
    echo "${what} overlap the ephemeral range (net.ipv4.ip_local_port_range) of ${names%, }"
}

# pick_port_base FIRST TRIES: the first block of PORT_OFFSETS every node can claim (job.sbatch's
# on_every_node) among the blocks outside every node's ephemeral range (read now, on each node);
# sets and exports PORT_BASE (and SLURMRL_PORT_BASE). FIRST is tried first when it is outside, else the job id's place among them;
# TRIES=1: FIRST or nothing (placement.port_base).
pick_port_base() {
    local base=$1 tries=$2 try at=-1 i
    local -a blocks
    PORT_RANGES="${LOG_DIR}/ephemeral-ranges"
    export PORT_RANGES
    rm -rf "${PORT_RANGES}" && mkdir -p "${PORT_RANGES}"
    on_every_node ephemeral_range_here || abort "could not read net.ipv4.ip_local_port_range on every node"
    if ((tries == 1)); then
        mapfile -t blocks < <(cat "${PORT_RANGES}"/* | port_blocks_outside "${base}")
        ((${#blocks[@]})) || abort "$(no_port_block "${base}")"
    else
        mapfile -t blocks < <(cat "${PORT_RANGES}"/* | port_blocks_outside)
        ((${#blocks[@]})) || abort "$(no_port_block)"
    fi
    for i in "${!blocks[@]}"; do [[ ${blocks[i]} != "${base}" ]] || at=${i}; done
    ((at >= 0)) || at=$((SLURM_JOB_ID % ${#blocks[@]}))
    for ((try = 1; try <= tries; try++)); do
        base=${blocks[at]}
        if on_every_node claim_ports_here "${base}" "${PORT_OFFSETS[@]}"; then
            PORT_BASE=${base}
            export PORT_BASE SLURMRL_PORT_BASE="${base}"
            phase "ports from ${PORT_BASE} claimed on every node"
            return 0
        fi
        on_every_node release_ports_here "${base}" || true
        at=$(( (at + 1 + RANDOM % 16) % ${#blocks[@]} ))
    done
    abort "no free block of ports after ${tries} tries (see ${LOG_DIR}/ports.*.log)"
}

# ---- leftovers of earlier jobs (Dynamo, wide EP) -------------------------------------------
# A killed wide-EP job can leave /dev/shm/moe_* files and GPU memory in use behind, and the
# next deployment on those nodes fails much later (out of memory). job.sbatch runs this on every
# node first (it exports it, with LEFTOVER_GPU_MIB) when its plan asks for it.
# check_leftovers_here: fail naming this node and what is left on it.
check_leftovers_here() {
    local files=() left=() index used
    shopt -s nullglob
    files=(/dev/shm/moe_*)
    if ((${#files[@]})); then left+=("${#files[@]} file(s) ${files[*]:0:3}${files[3]:+ ...}"); fi
    if command -v nvidia-smi >/dev/null; then  # this step's GPUs (SLURM_STEP_GPUS: node-wide indices)
        while IFS=', ' read -r index used; do
            if [[ ${used} =~ ^[0-9]+$ ]] && ((used > LEFTOVER_GPU_MIB)); then left+=("GPU ${index}: ${used} MiB in use"); fi
        done < <(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits ${SLURM_STEP_GPUS:+-i "${SLURM_STEP_GPUS}"})
    fi
    ((${#left[@]})) || return 0
    (IFS=';' && echo "$(hostname): ${left[*]}")
    return 1
}

# ---- container image: imported once into the shared cache (container.cache) ----------------
# Pyxis would import the image in every step. Here enroot imports it once, under a lock on the
# shared folder: a job that finds the lock taken waits for that import instead of its own.
# import_image IMAGE SQSH: a cache hit or miss, and the seconds spent, go to the phases.
import_image() {
    local image=$1 sqsh=$2 start=${SECONDS} waited lock
    command -v enroot >/dev/null || abort "container.cache: enroot is not on PATH on $(hostname)"
    mkdir -p "${sqsh%/*}" || abort "container.cache: cannot create ${sqsh%/*}"
    exec {lock}>>"${sqsh}.lock"
    flock "${lock}"
    waited=$((SECONDS - start))
    if [[ -s ${sqsh} ]]; then
        phase "container image: cache hit ${sqsh} (waited ${waited}s for the lock)"
    else
        rm -f "${sqsh}.partial"
        enroot import --output "${sqsh}.partial" "docker://${image}" || abort "container.cache: enroot import of ${image} failed (see this log)"
        mv -f "${sqsh}.partial" "${sqsh}"
        phase "container image: cache miss, imported ${image} into ${sqsh} in $((SECONDS - start - waited))s (waited ${waited}s for the lock)"
    fi
    exec {lock}>&-
}

# wait_pids WHAT PID...: wait for background steps; abort naming WHAT if one failed.
wait_pids() {
    local what=$1 pid
    shift
    for pid in "$@"; do
        wait "${pid}" || abort "${what}"
    done
}

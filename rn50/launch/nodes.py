"""Where the runner's workers go: the hosts of -H / --hostfile and their slots, which of them are this machine,
how many workers each node runs, and the GPU ids a node's workers pick from by local rank.

    nodes = Nodes.of(args)                        # the runner's -n, -H, --hostfile, --launcher, --kv-store
    per_node = workers_per_node(nodes, num_gpus)  # or a RecipeError for a request the nodes cannot run
    gpus = gpu_ids(num_gpus, per_node)            # the --gpus every worker of a node is given
    runs_here(nodes), remote_hosts(nodes)         # whether this machine is a node, the other hosts

The nodes are assumed alike: each has this machine's GPUs when it has any (or --gpus-per-node's).
"""
import dataclasses
import os
import re
import socket

from rn50.errors import RecipeError

LOCAL_HOSTS = ('localhost', '127.0.0.1', '::1')


@dataclasses.dataclass(frozen=True)
class Nodes:
    """The runner's flags about where the workers run (`of`): `ngpus` workers (-n), the hosts of -H (`hosts`,
    "host:slots,...") or --hostfile (`hostfile`), the `launcher` ('horovod' or 'slurm') and the `kv_store`."""
    ngpus: int = 1
    hosts: str = None
    hostfile: str = None
    launcher: str = 'horovod'
    kv_store: str = 'horovod'

    @classmethod
    def of(cls, args):
        return cls(ngpus=args.ngpus, hosts=args.hosts, hostfile=args.hostfile, launcher=args.launcher,
                   kv_store=args.kv_store)


def remote_hosts(nodes):
    """The hosts of -H / --hostfile that are not this machine, sorted."""
    here = set(LOCAL_HOSTS) | {socket.gethostname(), socket.getfqdn()}
    return sorted(set(host_names(nodes)) - here)


def runs_here(nodes):
    """Whether workers run on this machine (so that its DALI and MXNet are theirs): always but with -H /
    --hostfile naming other hosts only (a launch from a login node)."""
    hosts = host_names(nodes) if nodes.launcher == 'horovod' else []
    return not hosts or len(remote_hosts(nodes)) < len(set(hosts))


def host_names(nodes):
    """The hosts of -H / --hostfile (empty without them)."""
    if nodes.hosts:
        return [entry.split(':')[0] for entry in nodes.hosts.split(',') if entry]
    if nodes.hostfile:
        host_slots(nodes)   # a missing or malformed file: its RecipeError
        with open(nodes.hostfile) as f:
            return [line.split()[0] for line in f if line.strip() and not line.lstrip().startswith('#')]
    return []


def host_slots(nodes):
    """The slot count of every host of -H / --hostfile, in horovodrun's formats ("host:8,host2:8"; a host file
    of "host slots=8" lines), or None on one node."""
    if nodes.hosts:
        entries = [entry.strip() for entry in nodes.hosts.split(',') if entry.strip()]
        if not entries or not all(re.fullmatch(r'[\w.-]+:[0-9]+', entry) for entry in entries):
            raise RecipeError(f'-H {nodes.hosts}: expected host:slots[,host:slots...], e.g. host1:8,host2:8')
        return [int(entry.rsplit(':', 1)[1]) for entry in entries]
    if nodes.hostfile:
        try:
            with open(nodes.hostfile) as f:
                lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith('#')]
        except OSError as e:
            raise RecipeError(f'--hostfile {nodes.hostfile}: {e.strerror}') from None
        slots = []
        for line in lines:
            match = re.fullmatch(r'\S+\s+slots\s*=\s*([0-9]+)', line)
            if not match:
                raise RecipeError(f'--hostfile {nodes.hostfile}: line {line!r} is not "host slots=N"')
            slots.append(int(match.group(1)))
        if not slots:
            raise RecipeError(f'--hostfile {nodes.hostfile} lists no hosts')
        return slots
    return None


def slurm_task_counts(text):
    """The tasks of each node, from SLURM's compressed list ("2(x3),1" is [2, 2, 2, 1]); [] for none."""
    counts = []
    for match in re.finditer(r'([0-9]+)(?:\(x([0-9]+)\))?', text or ''):
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_tasks_per_node(environ):
    """The largest number of tasks SLURM runs on one node of this step, or None if SLURM does not say.
    SLURM_NTASKS_PER_NODE is "8" (given with --ntasks-per-node); SLURM_TASKS_PER_NODE is "8(x2)" or "8,4"."""
    counts = slurm_task_counts(environ.get('SLURM_NTASKS_PER_NODE') or environ.get('SLURM_TASKS_PER_NODE'))
    return max(counts) if counts else None


def workers_per_node(nodes, num_gpus, environ=os.environ):
    """How many workers one node runs; RecipeError for a request the nodes cannot run (judged by this
    machine's GPUs when it has any: the nodes are assumed alike)."""
    if nodes.launcher == 'slurm':
        tasks = environ.get('SLURM_STEP_NUM_TASKS') or environ.get('SLURM_NTASKS')
        if tasks and tasks.isdigit() and int(tasks) != nodes.ngpus:
            raise RecipeError(f'-n {nodes.ngpus} but srun runs {tasks} tasks (SLURM_NTASKS): with --launcher slurm -n '
                              f'is the number of tasks srun starts, one per GPU (-n {tasks}, or srun --ntasks '
                              f'{nodes.ngpus})')
        per_node = slurm_tasks_per_node(environ)
        if per_node is None:   # only SLURM_LOCALID, or no SLURM at all: this node's GPUs
            local_id = int(environ.get('SLURM_LOCALID', '0') or 0)
            per_node = max(min(nodes.ngpus, num_gpus or nodes.ngpus), local_id + 1)
        if num_gpus > 1 and per_node > num_gpus:
            raise RecipeError(f'SLURM runs {per_node} tasks on this node but each sees {num_gpus} GPUs: give every '
                              f'task all the node\'s GPUs (srun --gpus-per-node, or --gres=gpu:{per_node}), or ask '
                              f'for at most {num_gpus} tasks per node (--ntasks-per-node)')
        return min(per_node, nodes.ngpus)
    slots = host_slots(nodes) if nodes.kv_store == 'horovod' else None
    if slots is None:
        if num_gpus and nodes.ngpus > num_gpus:
            raise RecipeError(f'-n {nodes.ngpus} but this machine has {num_gpus} GPUs (add -H/--hostfile for several '
                              'nodes)')
        return nodes.ngpus
    where = f'-H {nodes.hosts}' if nodes.hosts else f'--hostfile {nodes.hostfile}'
    if sum(slots) < nodes.ngpus:
        raise RecipeError(f'-n {nodes.ngpus} but {where} has {sum(slots)} slots')
    if num_gpus and max(slots) > num_gpus:
        raise RecipeError(f'{where} asks for {max(slots)} workers on one node but this machine has {num_gpus} '
                          'GPUs: one worker per GPU (the nodes are assumed alike)')
    return min(max(slots), nodes.ngpus)


def gpu_ids(num_gpus, per_node):
    """The --gpus of every worker of a node, which takes the one of its local rank: 0..per_node-1, or just 0
    where each task sees a single GPU (SLURM's per-task binding; devices.check_one_worker_per_gpu refuses
    tasks that see the same one)."""
    if per_node > 1 and num_gpus == 1:
        return [0]
    return list(range(per_node))

--[[
FleetYield job_submit/lua plugin: map a job's declared workload class to node features.

Install: copy to /etc/slurm/job_submit.lua and set `JobSubmitPlugins=lua` in slurm.conf
(Debian's slurm-wlm ships job_submit/lua). slurmctld reloads the file when it changes.

CLASS DESIGN
  A job declares its class with `--comment=fy:<class>`, <class> one of
      decode | pretrain | finetune | batch | canary
  (the `fy:` token may sit anywhere in the comment, separated by spaces, `,` or `;`).
  Failing that, the class is derived from the partition name (first partition of the
  list) or else the QOS name when it equals a class (case-insensitive). Jobs with no
  class get class `default`, treated like pretrain: "green nodes only".

  The plugin ANDs one FleetYield feature to the job's constraint, preserving the user's:
      decode           -> fy_ok_decode    healthy non-premium nodes (see trade-off below)
      batch            -> fy_ok_batch     green, yellow and probation nodes
      finetune         -> fy_ok_finetune
      pretrain/default -> fy_ok_train     green (or yellow lent to a waiting gang)
      canary           -> nothing         the controller submits canaries itself with
                                          --constraint=fy_canary and -w <node>
  Constraint syntax: no user constraint -> `fy_ok_x`; a plain AND list (a&b, a,b) ->
  `a&b&fy_ok_x`; one with a top-level OR -> `(a|b)&fy_ok_x`; one already using
  brackets/parentheses whose ORs are all inside them -> `<user>&fy_ok_x`. A constraint
  that would need nested parentheses (top-level `|` mixed with `[`/`(`, which Slurm's
  feature parser does not nest) is left untouched and logged: the job runs ungated
  rather than being rejected for something the user did right. A constraint that
  already has the class feature as a top-level AND term (`a&fy_ok_x`, `fy_ok_x`) is
  left as is: the term is never doubled. Other fy_ok_* terms the user wrote are the
  user's and stay (`--constraint=fy_ok_decode` on an undeclared job gives
  `fy_ok_decode&fy_ok_train`: both are required). Re-running the plugin on a job modify
  that keeps the stored constraint first strips the one `&fy_ok_*` appended at submit,
  so it never stacks; a constraint given in the modify is the user's and is kept whole.
  (One ambiguity remains: a stored constraint ending in the class feature the user
  wrote themselves cannot be told from an appended one; if the modify changes the
  class, that term is replaced by the new class's.)

  The controller owns the fy_ok_* node features and recomputes them from node health
  and price tier. Decode trade-off: fy_ok_decode is only given to healthy NON-premium
  nodes, so decode jobs never land on premium (e.g. the best-interconnect) nodes while
  any non-premium node fits; the price is that decode may wait for a non-premium node
  even while premium nodes idle. The controller can widen fy_ok_decode onto premium
  nodes when non-premium capacity runs out -- that decision lives in the controller,
  not here.

  Only an unknown `fy:` class is rejected (slurm.ERROR with a message to the user via
  slurm.log_user). Class canary (fy:canary, or a partition/QOS named canary) is honoured
  only for the UIDs in FLEETYIELD_CANARY_UIDS (slurmctld environment, comma list;
  default "0": add the controller's UID); from anyone else it is treated as `default`
  (with a note to the user), otherwise any user could skip gating by calling a job a
  canary. Everything else returns slurm.SUCCESS.

HOT SPARES (optional; the controller's `[core.spares] enabled = true`)
  Two more class features, both off unless slurmctld's environment turns them on:
  * FLEETYIELD_GANG_MIN_NODES=N (default 0 = off): a pretrain/default job asking for at
    least N nodes (`-N`/`--nodes` min) is a gang and gets fy_ok_gang instead of fy_ok_train.
    The controller puts fy_ok_gang on every node carrying fy_ok_train plus the hot spares
    (fy_spare), so only gangs may restart on a spare. A job that asks GPUs but no node
    count is not recognised as a gang here (Slurm has not chosen a node count at submit).
    Use the same N as the controller's `[core.spares] gang_min_nodes`.
  * FLEETYIELD_PREEMPTIBLE_QOS=qos1,qos2 (default empty = off): a job whose QOS is listed
    gets fy_ok_preempt instead of its class feature, whatever its class. The controller
    puts fy_ok_preempt on every node carrying fy_ok_batch plus the hot spares, so
    preemptible work fills spares and Slurm's QOS preemption (PreemptType=preempt/qos,
    PreemptMode=REQUEUE, the gangs' QOS listing these in Preempt=) requeues it when a gang
    needs the node. A job that declares itself preemptible is gated like batch work.
  Both are read on every submit (no restart needed).

KILL SWITCH / BOOTSTRAP
  A constraint on a feature that no node carries makes a job pend forever
  ("Requested node configuration is not available" or worse, silently). So:
  * run the FleetYield controller (which labels nodes with fy_ok_*) BEFORE enabling
    this plugin; a cluster whose nodes carry no fy_ok_* feature yet must not use it.
    Once running, the controller keeps every class feature on at least one node
    (keep_open: a yellow node when no green one qualifies; an event names a class no
    node can carry);
  * if the file /etc/slurm/fleetyield.disabled exists (path overridable with the
    slurmctld env variable FLEETYIELD_JOB_SUBMIT_DISABLED_FILE), or the slurmctld
    environment sets FLEETYIELD_JOB_SUBMIT=off, the plugin adds nothing (checked on every
    submit, no restart needed). `touch /etc/slurm/fleetyield.disabled` is the
    emergency stop when the controller is down for long; pending jobs that already got
    a fy_ok_* constraint keep it (the controller's labels persist in Slurm while it is
    down, so they still match).
  Logging goes through slurm.log_info.
]]

local CLASS_FEATURE = {
   decode = "fy_ok_decode",
   batch = "fy_ok_batch",
   finetune = "fy_ok_finetune",
   pretrain = "fy_ok_train",
   default = "fy_ok_train",
   canary = false,
}

local function disabled_file()
   return os.getenv("FLEETYIELD_JOB_SUBMIT_DISABLED_FILE") or "/etc/slurm/fleetyield.disabled"
end

local function is_disabled()
   local switch = os.getenv("FLEETYIELD_JOB_SUBMIT")
   if switch ~= nil and string.lower(switch) == "off" then
      return true
   end
   local fh = io.open(disabled_file(), "r")
   if fh ~= nil then
      fh:close()
      return true
   end
   return false
end

local function canary_allowed(uid)
   local list = os.getenv("FLEETYIELD_CANARY_UIDS") or "0"
   for item in string.gmatch(list, "[^,%s]+") do
      if tonumber(item) ~= nil and tonumber(item) == tonumber(uid) then
         return true
      end
   end
   return false
end

-- Is `qos` one of FLEETYIELD_PREEMPTIBLE_QOS (comma list, case-insensitive)?
local function preemptible(qos)
   local list = os.getenv("FLEETYIELD_PREEMPTIBLE_QOS") or ""
   if qos == nil then
      return false
   end
   for item in string.gmatch(list, "[^,%s]+") do
      if string.lower(item) == string.lower(qos) then
         return true
      end
   end
   return false
end

local NO_VAL = 4294967294

-- A numeric job_desc field, or nil when not given (nil, or Slurm's NO_VAL and above).
local function given(value)
   local v = tonumber(value)
   if v == nil or v >= NO_VAL then
      return nil
   end
   return v
end

-- Does a job asking for at least `min_nodes` nodes count as a gang (FLEETYIELD_GANG_MIN_NODES)?
local function is_gang(min_nodes)
   local n = tonumber(os.getenv("FLEETYIELD_GANG_MIN_NODES") or "0") or 0
   local m = given(min_nodes)
   return n > 0 and m ~= nil and m >= n
end

local function log(msg)
   slurm.log_info("%s", "fleetyield: " .. msg)
end

-- Returns class, source or nil, error message (unknown fy: class).
local function job_class(comment, partition, qos)
   if comment ~= nil then
      for token in string.gmatch(comment, "[^%s,;]+") do
         local value = string.match(token, "^[Ff][Yy]:(.*)$")
         if value ~= nil then
            value = string.lower(value)
            if CLASS_FEATURE[value] == nil or value == "default" then
               return nil, string.format(
                  "FleetYield: unknown workload class 'fy:%s' in --comment; use one of "
                     .. "fy:decode, fy:pretrain, fy:finetune, fy:batch (or no fy: token)", value)
            end
            return value, "comment"
         end
      end
   end
   if partition ~= nil then
      local first = string.match(partition, "^%s*([^,%s]+)")
      if first ~= nil then
         local p = string.lower(first)
         if CLASS_FEATURE[p] ~= nil and p ~= "default" then
            return p, "partition"
         end
      end
   end
   if qos ~= nil then
      local q = string.lower(qos)
      if CLASS_FEATURE[q] ~= nil and q ~= "default" then
         return q, "qos"
      end
   end
   return "default", "none"
end

-- Remove a feature this plugin appended earlier (idempotent re-application).
local function strip_fy(constraint)
   if constraint == nil then
      return nil
   end
   local inner = string.match(constraint, "^%((.*)%)&fy_ok_[%w_]+$")
   if inner ~= nil then
      return inner
   end
   local prefix = string.match(constraint, "^(.*)&fy_ok_[%w_]+$")
   if prefix ~= nil then
      return prefix
   end
   if string.match(constraint, "^fy_ok_[%w_]+$") then
      return ""
   end
   return constraint
end

-- Does the expression have a `|` outside any () or []?
local function has_top_level_or(expr)
   local depth = 0
   for i = 1, #expr do
      local c = string.sub(expr, i, i)
      if c == "(" or c == "[" then
         depth = depth + 1
      elseif c == ")" or c == "]" then
         depth = depth - 1
      elseif c == "|" and depth == 0 then
         return true
      end
   end
   return false
end

-- Is `feature` one of the expression's top-level AND terms (split at `&`/`,` outside () and [])?
local function has_top_level_term(expr, feature)
   if has_top_level_or(expr) then
      return false
   end
   local depth, start = 0, 1
   for i = 1, #expr + 1 do
      local c = string.sub(expr, i, i)
      if c == "(" or c == "[" then
         depth = depth + 1
      elseif c == ")" or c == "]" then
         depth = depth - 1
      elseif (c == "&" or c == "," or c == "") and depth == 0 then
         if string.match(string.sub(expr, start, i - 1), "^%s*(.-)%s*$") == feature then
            return true
         end
         start = i + 1
      end
   end
   return false
end

-- Returns the new constraint string, or nil when it cannot be combined safely.
local function combine(user, feature)
   if user == nil or string.match(user, "^%s*$") then
      return feature
   end
   if has_top_level_term(user, feature) then
      return user
   end
   local grouped = string.find(user, "[%(%[]") ~= nil
   if not has_top_level_or(user) then
      return user .. "&" .. feature
   end
   if grouped then
      return nil
   end
   return "(" .. user .. ")&" .. feature
end

-- Decide the constraint for a job. Returns rc, new_features_or_nil, message. `stored`: `features`
-- is the job record's constraint (a modify that did not give one), which may end in the term
-- this plugin appended at submit; otherwise it is the user's own and nothing of it is removed.
local function decide(comment, partition, qos, features, uid, job_label, stored, min_nodes)
   if is_disabled() then
      log(job_label .. ": kill switch on, constraint left as is")
      return slurm.SUCCESS, nil
   end
   local class, source = job_class(comment, partition, qos)
   if class == nil then
      log(job_label .. ": rejected, " .. source)
      slurm.log_user("%s", source)
      return slurm.ERROR, nil
   end
   if class == "canary" and not canary_allowed(uid) then
      -- Not rejected (only unknown classes are): gated like an undeclared job instead.
      log(job_label .. ": canary class from non-controller uid " .. tostring(uid) .. ", treated as default")
      slurm.log_user("%s", "FleetYield: class 'canary' is reserved for the FleetYield controller; "
                        .. "job treated as undeclared (green nodes only)")
      class, source = "default", "canary-not-allowed"
   end
   local feature = CLASS_FEATURE[class]
   if feature and preemptible(qos) then
      feature, class = "fy_ok_preempt", class .. "+preemptible"
   elseif feature == "fy_ok_train" and is_gang(min_nodes) then
      feature, class = "fy_ok_gang", class .. "+gang"
   end
   local user = features
   if stored then
      user = strip_fy(features)
   end
   if not feature then
      log(string.format("%s: class=%s (%s), no feature added", job_label, class, source))
      if user ~= features then
         return slurm.SUCCESS, user
      end
      return slurm.SUCCESS, nil
   end
   local combined = combine(user, feature)
   if combined == nil then
      log(string.format("%s: class=%s (%s), constraint '%s' cannot be combined without nesting; "
                           .. "left ungated", job_label, class, source, tostring(user)))
      return slurm.SUCCESS, nil
   end
   log(string.format("%s: class=%s (%s), constraint '%s' -> '%s'",
                     job_label, class, source, tostring(features), combined))
   return slurm.SUCCESS, combined
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local label = "submit uid=" .. tostring(submit_uid)
   local rc, features = decide(job_desc.comment, job_desc.partition, job_desc.qos,
                               job_desc.features, submit_uid, label, false, job_desc.min_nodes)
   if rc == slurm.SUCCESS and features ~= nil then
      job_desc.features = features
   end
   return rc
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   -- Only re-decide when something the decision depends on changes.
   if job_desc.comment == nil and job_desc.partition == nil and job_desc.qos == nil
      and job_desc.features == nil and given(job_desc.min_nodes) == nil then
      return slurm.SUCCESS
   end
   local function pick(new, field)
      if new ~= nil then
         return new
      end
      if job_rec ~= nil then
         return job_rec[field]
      end
      return nil
   end
   local label = "modify job=" .. tostring(job_rec and job_rec.job_id) .. " uid=" .. tostring(modify_uid)
   -- The canary check uses the modifier's UID: the controller (or root) re-pins canaries.
   local rc, features = decide(pick(job_desc.comment, "comment"), pick(job_desc.partition, "partition"),
                               pick(job_desc.qos, "qos"), pick(job_desc.features, "features"),
                               modify_uid, label, job_desc.features == nil, pick(given(job_desc.min_nodes), "min_nodes"))
   if rc == slurm.SUCCESS and features ~= nil then
      job_desc.features = features
   end
   return rc
end

log("job_submit.lua loaded")
return slurm.SUCCESS

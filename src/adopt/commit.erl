%% commit.erl (delayd_adopt:commit/5 in src/adopt/delayd_adopt.erl, compiled
%% on the node): deletes from the delayed-message plugin on this node exactly
%% the entries a chunk moved (by their refs, which read.erl printed), then
%% resumes the plugin's process; first records the refs it deletes in a
%% file beside the node's Mnesia tables (check.erl reads it); run with
%% `rabbitmqctl -n NODE eval EXPRESSION` once Redis holds them (the two-step form's delete: with
%% `rabbitmqctl -n NODE eval_file FILE`, by an operator).
%% An index key of the exchange is deleted once none of its entries is left
%% (up to 3.11, an index key without entries makes the plugin's timer loop).
%% Entries of the chunk it does not find are counted and named, not an
%% error: the plugin delivered them (it ran again since the read).
%% Placeholders (filled by src/adopt/erlang.rs):
%%   @VHOST@ @NAME@  the exchange moved, base64
%%   @ITEMS@         [{TIMESTAMP, [REF, ...]}, ...], each REF as read.erl printed it,
%%                   or MODULE:items([_1, ...]), the same from values passed
%%                   after the expression (src/adopt/ctl.rs)
%%   @RESUME@        true | false (false: leave the plugin as it is)
%%   @FRESH@         true | false (true: a chunk's first call, which starts
%%                   the record of what is being deleted anew)
%% Prints lines "delayd-adopt WORD FIELDS...":
%%   was_held 0|1    (whether the plugin was still suspended: 0 after a
%%                    broker restart or a resume by hand since read.erl)
%%   gone TIMESTAMP REF (an entry not found) | deleted COUNT | missing COUNT | end
begin
@LOAD@
    @MODULE@:commit(base64:decode(<<"@VHOST@">>), base64:decode(<<"@NAME@">>), @ITEMS@, @RESUME@, @FRESH@)
end.
